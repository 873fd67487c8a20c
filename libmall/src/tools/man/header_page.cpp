// SPDX-License-Identifier: BSD-3-Clause
// header_page.cpp — reads mall.h's comments and declarations and writes mall(3) (see
// header_page.hpp). The header is read as text, line by line: it keeps one declaration group
// per comment, separated by blank lines, which is all this needs.
#include "tools/man/header_page.hpp"

#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <stdexcept>

#include "common/text.hpp"

namespace mall::man {

namespace {

struct Group {
    size_t first_line = 0;               // 1-based, for errors
    std::vector<std::string> comment;    // the leading comment's text lines, markers removed
    std::vector<std::string> code;       // the declarations, as written
    std::vector<std::string> names;      // public names declared, in order
    std::vector<std::string> functions;  // the functions among them
    std::vector<std::string> prototypes; // one line each, for the SYNOPSIS (roff)
    bool has_macro_only = true;
};

std::vector<std::string> split_lines(std::string_view text) {
    std::vector<std::string> lines;
    size_t start = 0;
    while (start < text.size()) {
        size_t end = text.find('\n', start);
        if (end == std::string_view::npos) end = text.size();
        std::string line(text.substr(start, end - start));
        while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.pop_back();
        lines.push_back(line);
        start = end + 1;
    }
    return lines;
}

// A block comment's lines without "/*", the leading " * " and "*/"; indentation after the
// star is kept ("  continued" list lines).
std::vector<std::string> comment_text(const std::vector<std::string> &raw) {
    std::vector<std::string> out;
    for (size_t i = 0; i < raw.size(); ++i) {
        std::string l = raw[i];
        size_t at = l.find_first_not_of(' ');
        if (at == std::string::npos) at = l.size();
        if (i == 0 && l.compare(at, 2, "/*") == 0)
            at += 2;
        else if (l.compare(at, 1, "*") == 0 && l.compare(at, 2, "*/") != 0)
            at += 1;
        if (at < l.size() && l[at] == ' ') ++at;
        l = l.substr(std::min(at, l.size()));
        if (i + 1 == raw.size()) {
            const size_t end = l.rfind("*/");
            if (end != std::string::npos) l = l.substr(0, end);
            while (!l.empty() && l.back() == ' ') l.pop_back();
        }
        out.push_back(l);
    }
    while (!out.empty() && out.back().empty()) out.pop_back();
    return out;
}

std::string strip_export(std::string line) {
    static const std::regex kExport(R"(\bMALL_EXPORT\s+)");
    return std::regex_replace(line, kExport, "");
}

void find_names(Group &g) {
    static const std::regex kDefine(R"(^#define\s+(MALL_\w+))");
    static const std::regex kFunctionPointer(R"(^typedef\b.*\(\s*\*\s*(\w+)\s*\))");
    static const std::regex kTypedefLine(R"(^typedef\b[^{]*\b(\w+)\s*;)");
    static const std::regex kBodyEnd(R"(^\}\s*(\w+)\s*;)");
    static const std::regex kEnum(R"(^enum\s+(\w+)\s*\{)");
    static const std::regex kFunction(R"(^(MALL_EXPORT\s+|static\s+inline\s+)([^(]*?)\b(mall_\w+)\s*\(([^)]*)\))");
    static const std::set<std::string> kNotPublic = {"MALL_MALL_H", "MALL_EXPORT"};
    int depth = 0;
    for (size_t i = 0; i < g.code.size(); ++i) {
        const std::string &l = g.code[i];
        std::smatch m;
        if (depth == 0) {
            if (std::regex_search(l, m, kDefine)) {
                if (!kNotPublic.count(m[1])) g.names.push_back(m[1]);
            } else if (std::regex_search(l, m, kFunction)) {
                g.names.push_back(m[3]);
                g.functions.push_back(m[3]);
                g.has_macro_only = false;
                std::string proto = escape(m[2].str()) + "\\fB" + escape(m[3].str()) + "\\fR(" + escape(m[4].str()) + ");";
                g.prototypes.push_back(proto);
            } else if (std::regex_search(l, m, kFunctionPointer) || std::regex_search(l, m, kTypedefLine)) {
                g.names.push_back(m[1]);
                g.has_macro_only = false;
            } else if (std::regex_search(l, m, kEnum)) {
                g.names.push_back("enum " + m[1].str());
                g.has_macro_only = false;
            }
        } else if (depth == 1 && std::regex_search(l, m, kBodyEnd)) {
            g.names.push_back(m[1]);
            g.has_macro_only = false;
        }
        for (char c : l) depth += c == '{' ? 1 : c == '}' ? -1 : 0;
    }
}

// Splits text (whitespace already collapsed) into sentences at ". " outside parentheses, not
// after the usual abbreviations.
std::vector<std::string> sentences(const std::string &text) {
    std::vector<std::string> out;
    int depth = 0;
    size_t start = 0;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        depth += c == '(' ? 1 : c == ')' ? -1 : 0;
        if (c != '.' || depth > 0 || i + 1 >= text.size() || text[i + 1] != ' ') continue;
        const size_t word = text.rfind(' ', i);
        const std::string last = text.substr(word == std::string::npos ? 0 : word + 1, i - (word == std::string::npos ? 0 : word + 1));
        if (last == "e.g" || last == "i.e" || last == "etc" || last == "vs" || last == "cf") continue;
        out.push_back(text.substr(start, i + 1 - start));
        start = i + 2;
    }
    if (start < text.size()) out.push_back(text.substr(start));
    return out;
}

std::string collapse(const std::vector<std::string> &lines) {
    std::string out;
    for (const auto &l : lines) {
        const std::string t = mall::trim(l);
        if (t.empty()) continue;
        if (!out.empty()) out += ' ';
        out += t;
    }
    return out;
}

// The comment as roff: paragraphs split at blank lines and before "Returns ..." (the return
// codes read best on their own), "- " items as a bullet list, a one-word lead ("Threads.") bold.
std::string render_comment(const std::vector<std::string> &lines) {
    static const std::regex kLead(R"(^([A-Z][a-z]+\.) (.*)$)");
    std::string out;
    bool open = false, in_item = false;
    auto paragraph = [&] {
        out += ".PP\n";
        open = true;
        in_item = false;
    };
    for (const auto &l : lines) {
        if (l.empty()) {
            open = false;
            continue;
        }
        if (l.rfind("- ", 0) == 0) {
            out += ".IP \\(bu 2\n" + text_line(l.substr(2)) + "\n";
            open = in_item = true;
            continue;
        }
        if (in_item && l.rfind("  ", 0) == 0) {
            out += text_line(mall::trim(l)) + "\n";
            continue;
        }
        if (!open || in_item || l.rfind("Returns ", 0) == 0) {
            paragraph();
            std::smatch m;
            if (std::regex_match(l, m, kLead)) {
                out += "\\fB" + escape(m[1].str()) + "\\fR " + escape(m[2].str()) + "\n";
                continue;
            }
        }
        out += text_line(mall::trim(l)) + "\n";
    }
    return out;
}

// Every block comment inside code lines, each joined into one text.
std::vector<std::string> code_comments(const std::vector<std::string> &code) {
    std::vector<std::string> out;
    std::string joined;
    for (const auto &l : code) joined += l + "\n";
    size_t at = 0;
    while ((at = joined.find("/*", at)) != std::string::npos) {
        const size_t end = joined.find("*/", at + 2);
        if (end == std::string::npos) break;
        std::vector<std::string> parts;
        std::string inner = joined.substr(at + 2, end - at - 2);
        size_t s = 0;
        while (s <= inner.size()) {
            size_t e = inner.find('\n', s);
            if (e == std::string::npos) e = inner.size();
            std::string part = mall::trim(inner.substr(s, e - s));
            if (!part.empty() && part[0] == '*') part = mall::trim(part.substr(1));
            parts.push_back(part);
            s = e + 1;
        }
        out.push_back(collapse(parts));
        at = end + 2;
    }
    return out;
}

}  // namespace

std::string render_header_page(std::string_view header_text, std::string_view include_as, const PageHeader &header,
                               const std::vector<std::string> &see_also_pages) {
    const std::vector<std::string> lines = split_lines(header_text);
    auto fail = [&](size_t line, const std::string &what) -> std::runtime_error {
        return std::runtime_error(std::string(include_as) + ":" + std::to_string(line) + ": " + what);
    };

    // A licence tag first ("/* SPDX-License-Identifier: ... */", one line) is not the page's.
    size_t i = 0;
    if (!lines.empty() && lines[0].rfind("/* SPDX-License-Identifier:", 0) == 0 && lines[0].find("*/") != std::string::npos)
        i = 1;
    // The opening comment: "<file> — <summary>." then the description.
    if (i >= lines.size() || lines[i].rfind("/*", 0) != 0)
        throw fail(i + 1, "the header must open with its /* ... */ comment");
    std::vector<std::string> raw;
    while (i < lines.size()) {
        raw.push_back(lines[i]);
        if (lines[i++].find("*/") != std::string::npos) break;
    }
    std::vector<std::string> intro = comment_text(raw);
    std::string summary;
    for (const char *dash : {" \xE2\x80\x94 ", " - "}) {
        const size_t at = intro.empty() ? std::string::npos : intro[0].find(dash);
        if (at != std::string::npos) {
            summary = mall::trim(intro[0].substr(at + std::string(dash).size()));
            break;
        }
    }
    if (summary.empty()) throw fail(1, "the opening comment's first line must read \"<file> \xE2\x80\x94 <summary>\"");
    if (summary.back() == '.') summary.pop_back();
    intro.erase(intro.begin());
    while (!intro.empty() && intro.front().empty()) intro.erase(intro.begin());

    // The declaration groups.
    std::vector<Group> groups;
    while (i < lines.size()) {
        if (lines[i].empty()) {
            ++i;
            continue;
        }
        Group g;
        g.first_line = i + 1;
        if (lines[i].find_first_not_of(' ') != std::string::npos && lines[i].compare(lines[i].find_first_not_of(' '), 2, "/*") == 0) {
            std::vector<std::string> c;
            while (i < lines.size()) {
                c.push_back(lines[i]);
                if (lines[i++].find("*/") != std::string::npos) break;
            }
            g.comment = comment_text(c);
        }
        // The group's code runs to a blank line or to the next comment at the line's start outside
        // braces (the next declaration's own comment: "/* Size of ... */\n#define ...").
        int depth = 0;
        while (i < lines.size() && !lines[i].empty() && !(depth == 0 && lines[i].rfind("/*", 0) == 0)) {
            for (char c : lines[i]) depth += c == '{' ? 1 : c == '}' ? -1 : 0;
            g.code.push_back(lines[i++]);
        }
        find_names(g);
        if (g.names.empty()) continue;  // include guard, includes, extern "C", the export macro
        if (g.comment.empty()) {
            std::string names;
            for (const auto &n : g.names) names += (names.empty() ? "" : ", ") + n;
            throw fail(g.first_line, names + " has no comment above it; say what it is for (mall(3) is made from it)");
        }
        groups.push_back(std::move(g));
    }

    std::string out = page_start(header, summary);

    out += ".SH SYNOPSIS\n.nf\n\\fB#include <" + escape(include_as) + ">\\fR\n.sp\n";
    for (const auto &g : groups)
        for (const auto &p : g.prototypes) out += "\\&" + p + "\n";
    out += ".fi\n.PP\nLink with \\fB\\-l" + escape(header.name) + "\\fR, or in CMake with \\fBfind_package(" +
           escape(header.name) + ")\\fR and the target \\fB" + escape(header.name) + "::" + escape(header.name) +
           "\\fR.\n";

    out += ".SH DESCRIPTION\n" + render_comment(intro);

    const std::pair<const char *, int> kinds[] = {{"MACROS", 0}, {"TYPES", 1}, {"FUNCTIONS", 2}};
    for (const auto &[title, kind] : kinds) {
        bool any = false;
        for (const auto &g : groups) {
            const int k = !g.functions.empty() ? 2 : g.has_macro_only ? 0 : 1;
            if (k != kind) continue;
            if (!any) out += ".SH " + std::string(title) + "\n";
            any = true;
            std::string names;
            for (const auto &n : g.names) names += (names.empty() ? "" : ", ") + n;
            out += ".SS " + quoted(names) + "\n.nf\n";
            for (const auto &c : g.code) out += text_line(strip_export(c)) + "\n";
            out += ".fi\n" + render_comment(g.comment);
        }
    }

    // ENVIRONMENT: each $MALL_* variable, with every sentence of the comments that mentions it.
    static const std::regex kVariable(R"(\$(MALL_[A-Z0-9_]+))");
    std::vector<std::string> order;
    std::map<std::string, std::vector<std::string>> mentions;  // variable -> roff paragraphs
    // where: the entry a sentence comes from, said after it ("(see mall_open())"); a paragraph
    // that opens with a field's name ("notify_signal: ...") adds it, since its later sentences
    // ("0: $MALL_NOTIFY_SIGNAL ...") need it.
    static const std::regex kFieldLead(R"(^([a-z_]+): )");
    auto scan = [&](const std::string &text, const std::string &where) {
        std::smatch field;
        std::string see = where;
        if (!where.empty() && std::regex_search(text, field, kFieldLead)) see += ", " + field[1].str();
        for (const auto &sentence : sentences(text)) {
            std::set<std::string> seen;
            for (std::sregex_iterator it(sentence.begin(), sentence.end(), kVariable), end; it != end; ++it) {
                const std::string var = (*it)[1];
                if (!seen.insert(var).second) continue;
                if (!mentions.count(var)) order.push_back(var);
                std::string para = escape(sentence);
                if (!see.empty()) para += " (see " + escape(see) + ")";
                auto &list = mentions[var];
                if (std::find(list.begin(), list.end(), para) == list.end()) list.push_back(para);
            }
        }
    };
    {
        std::vector<std::string> para;
        for (const auto &l : intro) {
            if (l.empty() || l.rfind("- ", 0) == 0) {
                scan(collapse(para), "");
                para.clear();
            }
            if (!l.empty()) para.push_back(l);
        }
        scan(collapse(para), "");
    }
    for (const auto &g : groups) {
        const std::string where = g.functions.empty() ? g.names.front() : g.functions.front() + "()";
        std::vector<std::string> para;
        for (const auto &l : g.comment) {
            if (l.empty()) {
                scan(collapse(para), where);
                para.clear();
            } else {
                para.push_back(l);
            }
        }
        scan(collapse(para), where);
        for (const auto &c : code_comments(g.code)) scan(c, where);
    }
    if (!order.empty()) {
        out += ".SH ENVIRONMENT\n";
        for (const auto &var : order) {
            out += ".TP\n.B " + escape(var) + "\n";
            const auto &list = mentions[var];
            for (size_t k = 0; k < list.size(); ++k) out += (k ? ".IP\n\\&" : "\\&") + list[k] + "\n";
        }
    }
    out += see_also(see_also_pages, header);
    return out;
}

}  // namespace mall::man
