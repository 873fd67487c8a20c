// SPDX-License-Identifier: BSD-3-Clause
// help_page.cpp — parses a tool's --help text into sections and blocks, and writes it as roff
// (see help_page.hpp for the text's convention). Every word of the text reaches the page; only
// the layout changes (headings become .SH, definition lists .TP, tables and examples
// .nf; not .EX, whose groff 1.22 definition turns hyphenation back on).
#include "tools/man/help_page.hpp"

#include <algorithm>
#include <cctype>
#include <optional>
#include <stdexcept>

namespace mall::man {

namespace {

struct Line {
    int indent = 0;
    std::string text;  // without the indentation and trailing blanks
};
using Chunk = std::vector<Line>;  // lines between blank lines

std::string lower(std::string_view text) {
    std::string out(text);
    for (char &c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

std::string upper(std::string_view text) {
    std::string out(text);
    for (char &c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return out;
}

std::vector<Chunk> split_chunks(std::string_view text) {
    std::vector<Chunk> chunks;
    Chunk current;
    size_t start = 0;
    while (start <= text.size()) {
        size_t end = text.find('\n', start);
        if (end == std::string_view::npos) end = text.size();
        std::string raw;
        for (char c : text.substr(start, end - start)) {
            if (c == '\t')
                raw.append(8 - raw.size() % 8, ' ');
            else
                raw += c;
        }
        while (!raw.empty() && std::isspace(static_cast<unsigned char>(raw.back()))) raw.pop_back();
        if (raw.empty()) {
            if (!current.empty()) chunks.push_back(std::move(current));
            current.clear();
        } else {
            const size_t indent = raw.find_first_not_of(' ');
            current.push_back({static_cast<int>(indent), raw.substr(indent)});
        }
        start = end + 1;
    }
    if (!current.empty()) chunks.push_back(std::move(current));
    return chunks;
}

// A heading opens its chunk, is unindented, short, ends in ':' and reads as a title, not as a
// sentence ("Options:", "Exit status:", "Global options (before or after the command):"; not
// "Follows malld's events as they happen, one line each:").
bool is_heading(const Line &line) {
    const std::string &t = line.text;
    if (line.indent != 0 || t.size() < 2 || t.size() > 50 || t.back() != ':') return false;
    for (const char *sentence_mark : {", ", ". ", "; ", ": ", "  "})
        if (t.find(sentence_mark) != std::string::npos) return false;
    return lower(t).rfind("usage:", 0) != 0;
}

// A long term is a synopsis ("set JOB [--cpus LIST|auto]"), never a phrase ("weighted idle cores
// are lent ...,": a table row that wrapped).
bool reads_as_sentence(std::string_view text) {
    for (const char *mark : {", ", ": ", "; ", ". "})
        if (text.find(mark) != std::string_view::npos) return true;
    return std::string_view(",;:.").find(text.back()) != std::string_view::npos;
}

bool balanced(std::string_view text) {
    return std::count(text.begin(), text.end(), '[') == std::count(text.begin(), text.end(), ']') &&
           std::count(text.begin(), text.end(), '(') == std::count(text.begin(), text.end(), ')');
}

Block verbatim(const std::vector<Line> &run) {
    Block block;
    block.kind = Block::Kind::Verbatim;
    for (const auto &l : run) block.lines.push_back(std::string(l.indent, ' ') + l.text);
    return block;
}

// An indented run as a definition list when every entry has a term and a description aligned
// on one column; anything else (tables, examples, ragged text) stays verbatim.
Block parse_indented(const std::vector<Line> &run) {
    const int base = run.front().indent;
    struct Entry {
        Line head;
        std::vector<Line> more;
    };
    std::vector<Entry> entries;
    for (const auto &l : run) {
        if (l.indent < base) return verbatim(run);
        if (l.indent == base)
            entries.push_back({l, {}});
        else
            entries.back().more.push_back(l);
    }
    // The description column: where the text after the term's gap (two spaces or more) starts.
    std::optional<int> column;
    for (const auto &e : entries) {
        const size_t gap = e.head.text.find("  ");
        if (gap == std::string::npos) continue;
        const int at = base + static_cast<int>(e.head.text.find_first_not_of(' ', gap));
        if (column && *column != at) return verbatim(run);
        column = at;
    }
    if (!column) return verbatim(run);

    Block block;
    block.kind = Block::Kind::Definitions;
    for (const auto &e : entries) {
        Definition d;
        std::string first;  // the description's text on the term's line
        const std::string &head = e.head.text;
        const size_t gap = head.find("  ");
        const size_t at = static_cast<size_t>(*column - base);
        if (gap != std::string::npos) {
            d.term = head.substr(0, gap);
            first = head.substr(at);
        } else if (head[0] == '-' && head.size() > at && head[at - 1] == ' ' && head[at] != ' ' &&
                   balanced(head.substr(0, at - 1))) {
            // An option whose term fills the column up to one space (Boost's longest one).
            d.term = head.substr(0, at - 1);
            first = head.substr(at);
        } else if (!e.more.empty() && e.more.front().indent == *column && !reads_as_sentence(head)) {
            d.term = head;  // a long term: its description starts on the next line
        } else {
            return verbatim(run);
        }
        if (first.find("  ") != std::string::npos) return verbatim(run);  // a table row
        if (!first.empty()) d.description.push_back(first);
        for (const auto &m : e.more) {
            if (m.indent != *column) d.keep_layout = true;
            d.description.push_back(std::string(std::max(0, m.indent - *column), ' ') + m.text);
        }
        if (d.description.empty()) return verbatim(run);
        block.definitions.push_back(std::move(d));
    }
    return block;
}

void parse_body(const std::vector<Line> &lines, Section &section) {
    size_t i = 0;
    while (i < lines.size()) {
        const bool indented = lines[i].indent > 0;
        std::vector<Line> run;
        while (i < lines.size() && (lines[i].indent > 0) == indented) run.push_back(lines[i++]);
        if (indented) {
            section.blocks.push_back(parse_indented(run));
        } else {
            Block p;
            for (auto &l : run) p.lines.push_back(l.text);
            section.blocks.push_back(std::move(p));
        }
    }
}

// "Usage: X" (with continuation lines aligned under X) or "Usage:" over indented lines.
std::vector<std::string> parse_usage(const Chunk &chunk) {
    const std::string &first = chunk.front().text;
    size_t at = std::string("usage:").size();
    while (at < first.size() && first[at] == ' ') ++at;
    std::vector<std::string> usage;
    if (at < first.size()) {
        usage.push_back(first.substr(at));
        for (size_t k = 1; k < chunk.size(); ++k)
            usage.push_back(std::string(std::max(0, chunk[k].indent - static_cast<int>(at)), ' ') + chunk[k].text);
    } else {
        int common = 1 << 20;
        for (size_t k = 1; k < chunk.size(); ++k) common = std::min(common, chunk[k].indent);
        for (size_t k = 1; k < chunk.size(); ++k)
            usage.push_back(std::string(chunk[k].indent - common, ' ') + chunk[k].text);
    }
    return usage;
}

struct Renderer {
    std::string out;
    bool section_start = true;  // no paragraph break needed right after a heading

    void paragraph_break() {
        if (!section_start) out += ".PP\n";
        section_start = false;
    }

    void blocks(const std::vector<Block> &blocks) {
        for (const auto &b : blocks) {
            switch (b.kind) {
                case Block::Kind::Paragraph:
                    paragraph_break();
                    for (const auto &l : b.lines) out += text_line(l) + "\n";
                    break;
                case Block::Kind::Verbatim:
                    paragraph_break();
                    out += ".nf\n";
                    for (const auto &l : b.lines) out += text_line(l) + "\n";
                    out += ".fi\n";
                    break;
                case Block::Kind::Definitions:
                    for (const auto &d : b.definitions) {
                        out += ".TP\n" + term_markup(d.term) + "\n";
                        if (d.keep_layout) out += ".nf\n";
                        for (const auto &l : d.description) out += text_line(d.keep_layout ? l : trim(l)) + "\n";
                        if (d.keep_layout) out += ".fi\n";
                    }
                    section_start = false;
                    break;
            }
        }
    }

    void synopsis(const std::vector<std::string> &usage, std::string_view program) {
        out += ".nf\n";
        for (const auto &l : usage) out += synopsis_line(l, program) + "\n";
        out += ".fi\n";
    }
};

}  // namespace

HelpText parse_help(std::string_view text) {
    HelpText help;
    std::vector<Chunk> chunks = split_chunks(text);
    if (chunks.empty()) throw std::runtime_error("the help text is empty");
    size_t next = 0;
    // The title line: "NAME - summary", alone in the first chunk.
    if (chunks[0].size() == 1 && chunks[0][0].indent == 0) {
        const std::string &t = chunks[0][0].text;
        const size_t dash = t.find(" - ");
        if (dash != std::string::npos && dash > 0 && t.find(' ') == dash) {
            help.name = t.substr(0, dash);
            help.summary = trim(t.substr(dash + 3));
            next = 1;
        }
    }
    help.sections.push_back({});
    bool seen_usage = false;
    for (; next < chunks.size(); ++next) {
        const Chunk &chunk = chunks[next];
        if (!seen_usage && chunk[0].indent == 0 && lower(chunk[0].text).rfind("usage:", 0) == 0) {
            help.usage = parse_usage(chunk);
            seen_usage = true;
            continue;
        }
        std::vector<Line> body = chunk;
        if (is_heading(chunk[0])) {
            help.sections.push_back({chunk[0].text.substr(0, chunk[0].text.size() - 1), {}});
            body.erase(body.begin());
        }
        parse_body(body, help.sections.back());
    }
    if (!seen_usage) throw std::runtime_error("the help text has no \"Usage:\" line");
    return help;
}

std::vector<std::string> command_names(const HelpText &help) {
    std::vector<std::string> names;
    for (const auto &s : help.sections) {
        if (lower(s.heading) != "commands") continue;
        for (const auto &b : s.blocks) {
            if (b.kind == Block::Kind::Definitions) {
                for (const auto &d : b.definitions) names.push_back(d.term.substr(0, d.term.find(' ')));
            } else if (b.kind == Block::Kind::Verbatim) {
                size_t least = std::string::npos;
                for (const auto &l : b.lines) least = std::min(least, l.find_first_not_of(' '));
                for (const auto &l : b.lines)
                    if (l.find_first_not_of(' ') == least) names.push_back(trim(l).substr(0, trim(l).find(' ')));
            }
        }
    }
    return names;
}

std::string render_tool_page(const HelpText &help, const std::vector<std::pair<std::string, HelpText>> &commands,
                             const PageHeader &header, const std::vector<std::string> &see_also_pages) {
    if (help.summary.empty())
        throw std::runtime_error("the help text has no title line \"" + header.name + " - summary\"");
    if (help.name != header.name)
        throw std::runtime_error("the help text's title names '" + help.name + "', not '" + header.name + "'");
    Renderer r;
    r.out = page_start(header, help.summary);
    r.out += ".SH SYNOPSIS\n";
    r.synopsis(help.usage, header.name);
    bool commands_placed = commands.empty();
    for (const auto &section : help.sections) {
        if (section.heading.empty()) {
            if (section.blocks.empty()) continue;
            r.out += ".SH DESCRIPTION\n";
        } else {
            r.out += ".SH " + quoted(upper(section.heading)) + "\n";
        }
        r.section_start = true;
        r.blocks(section.blocks);
        if (lower(section.heading) != "commands" || commands.empty()) continue;
        commands_placed = true;
        for (const auto &[name, command] : commands) {
            r.out += ".SS " + quoted(name) + "\n";
            r.synopsis(command.usage, header.name);
            r.section_start = false;
            for (const auto &sub : command.sections) {
                if (!sub.heading.empty()) {
                    r.out += ".PP\n\\fB" + escape(sub.heading + ":") + "\\fR\n";
                    r.section_start = true;
                }
                r.blocks(sub.blocks);
            }
        }
    }
    if (!commands_placed) throw std::runtime_error("command help given, but the text has no \"Commands:\" section");
    r.out += see_also(see_also_pages, header);
    return r.out;
}

}  // namespace mall::man
