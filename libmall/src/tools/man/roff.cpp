// SPDX-License-Identifier: BSD-3-Clause
// roff.cpp — escaping and the shared pieces of every generated page (see roff.hpp).
#include "tools/man/roff.hpp"

#include <cctype>
#include <cstdio>
#include <stdexcept>

namespace mall::man {

namespace {

// Decodes one UTF-8 sequence starting at text[i]; advances i past it. Malformed bytes are taken
// one by one as Latin-1, so the output stays valid roff whatever the input.
unsigned decode_utf8(std::string_view text, size_t &i) {
    const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
    const unsigned lead = byte(i);
    const size_t extra = lead >= 0xF8 ? 0 : lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC0 ? 1 : 0;
    if (extra == 0 || i + extra >= text.size()) {
        ++i;
        return lead;
    }
    unsigned code = lead & (0x3F >> extra);
    for (size_t k = 1; k <= extra; ++k) {
        if ((byte(i + k) & 0xC0) != 0x80) {
            ++i;
            return lead;
        }
        code = (code << 6) | (byte(i + k) & 0x3F);
    }
    i += extra + 1;
    return code;
}

bool is_option_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; }

// Marks up one token: option names in bold, placeholders (upper case, or boost's "arg") in
// italic, everything else in roman. The visible characters are exactly the token's.
std::string markup_token(std::string_view token) {
    std::string out;
    size_t i = 0;
    while (i < token.size()) {
        const char c = token[i];
        const bool starts_option = c == '-' && (i == 0 || std::string_view("[(|,=").find(token[i - 1]) != std::string_view::npos) &&
                                   i + 1 < token.size() && is_option_char(token[i + 1]);
        if (starts_option) {
            size_t j = i;
            while (j < token.size() && is_option_char(token[j])) ++j;
            out += "\\fB" + escape(token.substr(i, j - i)) + "\\fR";
            i = j;
            continue;
        }
        if (std::isalnum(static_cast<unsigned char>(c)) || c == '_') {
            size_t j = i;
            while (j < token.size() && (std::isalnum(static_cast<unsigned char>(token[j])) || token[j] == '_')) ++j;
            const std::string_view word = token.substr(i, j - i);
            bool upper = false, lower = false;
            for (char w : word) {
                upper |= std::isupper(static_cast<unsigned char>(w)) != 0;
                lower |= std::islower(static_cast<unsigned char>(w)) != 0;
            }
            if ((upper && !lower) || word == "arg")
                out += "\\fI" + escape(word) + "\\fR";
            else
                out += escape(word);
            i = j;
            continue;
        }
        out += escape(token.substr(i, 1));
        ++i;
    }
    return out;
}

std::string markup_words(std::string_view text, bool first_word_bold) {
    std::string out;
    size_t i = 0;
    bool first = true;
    while (i < text.size()) {
        if (text[i] == ' ') {
            out += ' ';
            ++i;
            continue;
        }
        size_t j = text.find(' ', i);
        if (j == std::string_view::npos) j = text.size();
        const std::string_view token = text.substr(i, j - i);
        bool plain_word = true;
        for (char c : token) plain_word &= std::islower(static_cast<unsigned char>(c)) || c == '-' || c == '_';
        if (first && first_word_bold && plain_word && token.front() != '-')
            out += "\\fB" + escape(token) + "\\fR";
        else
            out += markup_token(token);
        first = false;
        i = j;
    }
    return out;
}

}  // namespace

std::string escape(std::string_view text) {
    std::string out;
    out.reserve(text.size() + text.size() / 4);
    size_t i = 0;
    while (i < text.size()) {
        const unsigned char c = static_cast<unsigned char>(text[i]);
        if (c >= 0x80) {
            const unsigned code = decode_utf8(text, i);
            char buf[16];
            std::snprintf(buf, sizeof buf, "\\[u%04X]", code);
            out += buf;
            continue;
        }
        switch (c) {
            case '\\': out += "\\(rs"; break;
            case '-': out += "\\-"; break;
            case '\'': out += "\\(aq"; break;
            case '`': out += "\\(ga"; break;
            case '^': out += "\\(ha"; break;
            case '~': out += "\\(ti"; break;
            case '\t': out += "        "; break;
            default:
                if (c < 0x20) throw std::runtime_error("control character " + std::to_string(c) + " in text");
                out += static_cast<char>(c);
        }
        ++i;
    }
    return out;
}

std::string text_line(std::string_view text) {
    std::string out = escape(text);
    if (!out.empty() && (out[0] == '.' || out[0] == '\'')) out.insert(0, "\\&");
    return out;
}

std::string quoted(std::string_view text) {
    std::string out = "\"";
    for (char c : escape(text)) out += c == '"' ? std::string("\\(dq") : std::string(1, c);
    return out + "\"";
}

std::string term_markup(std::string_view term) { return markup_words(term, true); }

std::string synopsis_line(std::string_view line, std::string_view program) {
    size_t lead = 0;
    while (lead < line.size() && line[lead] == ' ') ++lead;
    std::string out = "\\&" + std::string(lead, ' ');
    std::string_view rest = line.substr(lead);
    if (rest.substr(0, program.size()) == program && (rest.size() == program.size() || rest[program.size()] == ' ')) {
        out += "\\fB" + escape(program) + "\\fR";
        rest.remove_prefix(program.size());
    }
    return out + markup_words(rest, false);
}

std::string page_start(const PageHeader &header, std::string_view summary) {
    std::string title;
    for (char c : header.name) title += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    std::string out = ".\\\" Generated by mall-help2man from " + header.name +
                      "'s own text; edit that, not this file.\n";
    out += ".TH " + quoted(title) + " " + header.section + " \"\" " + quoted(header.source) + " " +
           quoted(header.manual) + "\n";
    // No hyphenation: a word in the rendered page reads as it does in the source text.
    out += ".nh\n";
    out += ".SH NAME\n" + text_line(header.name) + " \\- " + escape(summary) + "\n";
    return out;
}

std::string see_also(const std::vector<std::string> &pages, const PageHeader &self) {
    std::vector<std::string> lines;
    for (const auto &page : pages) {
        const size_t open = page.find('(');
        if (open == std::string::npos || page.back() != ')')
            throw std::runtime_error("--see-also: '" + page + "' is not NAME(SECTION), e.g. malld(8)");
        const std::string name = page.substr(0, open), section = page.substr(open + 1, page.size() - open - 2);
        if (name == self.name && section == self.section) continue;
        lines.push_back(".BR " + escape(name) + " (" + escape(section) + ")");
    }
    if (lines.empty()) return "";
    std::string out = ".SH \"SEE ALSO\"\n";
    for (size_t i = 0; i < lines.size(); ++i) out += lines[i] + (i + 1 < lines.size() ? ",\n" : "\n");
    return out;
}

}  // namespace mall::man
