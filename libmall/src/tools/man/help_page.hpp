// SPDX-License-Identifier: BSD-3-Clause
// help_page.hpp — a tool's --help text as a man page. The text follows the tools' convention: a
// title line "NAME - summary"; a usage ("Usage: ..." or a "Usage:" heading over indented lines);
// paragraphs; headings (an unindented line ending in ':' that opens a blank-line-separated
// chunk); indented definition lists ("  --opt ARG   description", continuation lines further
// indented) and indented verbatim blocks (tables, examples). parse_help() reads that structure,
// render_tool_page() writes roff man(7) that keeps every word of the text.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tools/man/roff.hpp"

namespace mall::man {

struct Definition {
    std::string term;                      // "--socket PATH", "status [--json]", "0"
    std::vector<std::string> description;  // one entry per source line
    bool keep_layout = false;              // description lines keep their relative indentation
};

struct Block {
    enum class Kind { Paragraph, Definitions, Verbatim };
    Kind kind = Kind::Paragraph;
    std::vector<std::string> lines;  // Paragraph: the lines; Verbatim: with their indentation
    std::vector<Definition> definitions;
};

struct Section {
    std::string heading;  // without the ':'; empty for what precedes the first heading
    std::vector<Block> blocks;
};

struct HelpText {
    std::string name, summary;        // from the title line; empty when there is none
    std::vector<std::string> usage;   // the synopsis lines, "Usage:" removed, layout kept
    std::vector<Section> sections;    // sections[0] has no heading (the description)
};

HelpText parse_help(std::string_view text);

// The first word of each entry of the "Commands:" section (empty when there is none).
std::vector<std::string> command_names(const HelpText &help);

// The page: NAME, SYNOPSIS, DESCRIPTION, one .SH per heading; with commands, the "Commands"
// section is followed by one .SS per command holding that command's help; then SEE ALSO.
std::string render_tool_page(const HelpText &help, const std::vector<std::pair<std::string, HelpText>> &commands,
                             const PageHeader &header, const std::vector<std::string> &see_also_pages);

}  // namespace mall::man
