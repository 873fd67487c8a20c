// SPDX-License-Identifier: BSD-3-Clause
// help2man_main.cpp — mall-help2man, the build-time tool that writes mall's man pages from the
// texts users already see: a tool's --help (run here, or read from a file or stdin), each
// `TOOL help COMMAND` for the commands its "Commands:" section lists, or the public header.
// Runs the tool with MALL_* variables removed, so the page never depends on the caller's
// environment; writes nothing but --output (through --output.tmp). Exit 0; 1 with the reason on
// stderr; 2 on a bad command line.
#include <sys/wait.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/run_bounded.hpp"
#include "tools/man/header_page.hpp"
#include "tools/man/help_page.hpp"

extern char **environ;

namespace {

using namespace mall::man;

const char kUsage[] =
    "mall-help2man - write a man page from a tool's --help text or from mall.h\n"
    "\n"
    "Usage:\n"
    "  mall-help2man --name NAME --section N --source TEXT [--manual TEXT] [--see-also PAGE]...\n"
    "                --output FILE (--program PATH [--commands] | --help-text FILE|- | --header FILE\n"
    "                [--include-as PATH])\n"
    "\n"
    "  --program PATH     run PATH --help (and, with --commands, PATH help CMD for each command of\n"
    "                     its \"Commands:\" section) and convert the text\n"
    "  --help-text FILE   convert the help text in FILE (- for stdin)\n"
    "  --header FILE      write the C API page from the header FILE (--include-as: its #include path)\n"
    "  --see-also PAGE    a page for SEE ALSO, e.g. malld(8); repeatable, the page itself is skipped\n";

// Runs argv with MALL_* removed from the environment; returns its stdout. Throws when it cannot
// run, runs longer than 30 s, writes nothing, or exits with a status other than 0.
std::string run_program(const std::vector<std::string> &argv) {
    mall::BoundedCommand command;
    command.argv = argv;
    command.environment.emplace();
    for (char **e = environ; *e; ++e)
        if (std::strncmp(*e, "MALL_", 5) != 0) command.environment->push_back(*e);
    command.limit = std::chrono::seconds(30);
    const std::string what = mall::command_text(argv);
    mall::BoundedResult run = mall::run_bounded(command);
    if (run.spawn_error != 0) {
        // As an exec that failed in the child would say it: the reason, then the exit status.
        std::fprintf(stderr, "mall-help2man: cannot run %s: %s\n", argv[0].c_str(), std::strerror(run.spawn_error));
        throw std::runtime_error(what + " failed (exit 127)");
    }
    if (run.timed_out) throw std::runtime_error(what + " still running after 30 s; killed it");
    if (!WIFEXITED(run.status) || WEXITSTATUS(run.status) != 0)
        throw std::runtime_error(what + " failed (" +
                                 (WIFEXITED(run.status) ? "exit " + std::to_string(WEXITSTATUS(run.status))
                                                        : "signal " + std::to_string(WTERMSIG(run.status))) +
                                 ")");
    if (run.output.empty()) throw std::runtime_error(what + " printed nothing");
    return run.output;
}

std::string read_file(const std::string &path) {
    if (path == "-") {
        std::ostringstream s;
        s << std::cin.rdbuf();
        return s.str();
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read " + path + ": " + std::strerror(errno));
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

// Writes through a temporary next to the output, so a failed run leaves no half page behind.
void write_file(const std::string &path, const std::string &text) {
    const std::string tmp = path + ".tmp";
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        if (!out) throw std::runtime_error("cannot write " + tmp + ": " + std::strerror(errno));
        out << text;
        if (!out.flush()) throw std::runtime_error("cannot write " + tmp + ": " + std::strerror(errno));
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
        throw std::runtime_error("cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
}

int run(int argc, char **argv) {
    PageHeader header;
    header.manual = "mall manual";
    std::vector<std::string> see_also_pages;
    std::string output, program, help_text, header_file, include_as = "mall/mall.h";
    bool commands = false;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
            return argv[++i];
        };
        if (arg == "--name") header.name = value();
        else if (arg == "--section") header.section = value();
        else if (arg == "--source") header.source = value();
        else if (arg == "--manual") header.manual = value();
        else if (arg == "--see-also") see_also_pages.push_back(value());
        else if (arg == "--output") output = value();
        else if (arg == "--program") program = value();
        else if (arg == "--commands") commands = true;
        else if (arg == "--help-text") help_text = value();
        else if (arg == "--header") header_file = value();
        else if (arg == "--include-as") include_as = value();
        else if (arg == "-h" || arg == "--help") {
            std::cout << kUsage;
            return 0;
        } else {
            throw std::invalid_argument("unknown argument '" + arg + "'");
        }
    }
    if (header.name.empty() || header.section.empty() || header.source.empty() || output.empty())
        throw std::invalid_argument("--name, --section, --source and --output are required");
    if (!program.empty() + !help_text.empty() + !header_file.empty() != 1)
        throw std::invalid_argument("give one of --program, --help-text or --header");
    if (commands && program.empty()) throw std::invalid_argument("--commands needs --program");

    std::string page;
    if (!header_file.empty()) {
        page = render_header_page(read_file(header_file), include_as, header, see_also_pages);
    } else {
        const HelpText help = parse_help(program.empty() ? read_file(help_text) : run_program({program, "--help"}));
        std::vector<std::pair<std::string, HelpText>> command_help;
        if (commands) {
            const auto names = command_names(help);
            if (names.empty()) throw std::runtime_error(program + " --help lists no commands under \"Commands:\"");
            for (const auto &name : names) command_help.emplace_back(name, parse_help(run_program({program, "help", name})));
        }
        page = render_tool_page(help, command_help, header, see_also_pages);
    }
    write_file(output, page);
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    try {
        return run(argc, argv);
    } catch (const std::invalid_argument &e) {
        std::cerr << "mall-help2man: " << e.what() << "\n" << kUsage;
        return 2;
    } catch (const std::exception &e) {
        std::cerr << "mall-help2man: " << e.what() << "\n";
        return 1;
    }
}
