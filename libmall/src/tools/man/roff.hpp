// SPDX-License-Identifier: BSD-3-Clause
// roff.hpp — what every generated man page shares: escaping text for roff man(7) source, the page
// header (.TH, NAME), option/command terms in bold and placeholders in italic, SEE ALSO.
// Contract: escape() output renders back to the same characters (hyphens as \-, quotes as \(aq,
// backslashes, non-ASCII as \[uXXXX]) and never starts a control line; nothing here adds a date.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/text.hpp"

namespace mall::man {

// The fixed fields of a page: .TH NAME SECTION "" SOURCE MANUAL (no date: reproducible output).
struct PageHeader {
    std::string name;     // "mallctl"
    std::string section;  // "1", "8", "3"
    std::string source;   // "mall 0.3.0"
    std::string manual;   // "mall manual"
};

// Text for a roff text line: every character renders as itself.
std::string escape(std::string_view text);
// escape(), guarded with \& so that a leading '.' or '\'' is not read as a control line.
std::string text_line(std::string_view text);
// A double-quoted macro argument.
std::string quoted(std::string_view text);
// A definition's term: option names (-x, --name) and a leading command word in bold, upper-case
// placeholders (PATH, N|auto, arg) in italic, the rest (brackets, defaults) in roman.
std::string term_markup(std::string_view term);
// A synopsis line with the program's name in bold where it starts a word at the line's start.
std::string synopsis_line(std::string_view line, std::string_view program);

// .TH, hyphenation off (so rendered words match the source), and the NAME section.
std::string page_start(const PageHeader &header, std::string_view summary);
// SEE ALSO: the pages ("malld(8)") other than this one, in the given order.
std::string see_also(const std::vector<std::string> &pages, const PageHeader &self);

// Trimming is the one mall::trim (common/text.hpp): the pages call it unqualified from here.
using mall::trim;

}  // namespace mall::man
