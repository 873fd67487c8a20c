// SPDX-License-Identifier: BSD-3-Clause
// example_options.hpp — the command-line parse every example trainer does the same way (Boost
// program_options): on a bad option it prints "<program>: <what>" and "see `<program> --help`" to
// stderr (only when `speak`, e.g. on MPI rank 0) and returns false; the caller exits with 2.
// options_text(): the options' table as Boost formats it, for a --help the trainer prints itself.
#pragma once

#include <cstdio>
#include <sstream>
#include <string>

#include <boost/program_options.hpp>

namespace mall::examples {

inline bool parse_options(const char *program, int argc, char **argv,
                          const boost::program_options::options_description &options,
                          boost::program_options::variables_map &values, bool speak = true) {
    try {
        boost::program_options::store(boost::program_options::parse_command_line(argc, argv, options), values);
        boost::program_options::notify(values);
        return true;
    } catch (const boost::program_options::error &e) {
        if (speak) std::fprintf(stderr, "%s: %s\nsee `%s --help`\n", program, e.what(), program);
        return false;
    }
}

inline std::string options_text(const boost::program_options::options_description &options) {
    std::ostringstream text;
    text << options;
    return text.str();
}

}  // namespace mall::examples
