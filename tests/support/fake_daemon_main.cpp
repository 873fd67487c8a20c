// SPDX-License-Identifier: BSD-3-Clause
// fake_daemon_main.cpp — mall_fake_daemon: FakeDaemon (fake_daemon.hpp) as a program, for tests
// outside C++ (python/tests/test_fork.py). Usage: mall_fake_daemon SOCKET. It serves job
// "fake-job" at generation 1 on cpu 0, prints "ready" once listening, then takes one command per
// line on stdin and answers each with one line on stdout:
//   publish CPUS          -> "generation N"  (a new generation, Notify sent to attached clients)
//   restart GENERATION CPUS -> "generation N" (hangs up on everyone, a new page, as a restarted malld)
//   attaches              -> "attaches N"     (Attach requests served since the start)
// End of input (or "quit") stops it; it removes its socket. Exit 0, or 1 with words on stderr.
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>

#include "support/fake_daemon.hpp"

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: mall_fake_daemon SOCKET\n");
        return 1;
    }
    mall::test::FakeDaemon daemon(argv[1]);
    std::string error;
    if (!daemon.start(1, "0", &error)) {
        std::fprintf(stderr, "mall_fake_daemon: cannot listen on %s: %s\n", argv[1], error.c_str());
        return 1;
    }
    std::cout << "ready" << std::endl;
    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream words(line);
        std::string command;
        words >> command;
        if (command == "publish") {
            std::string cpus;
            words >> cpus;
            std::cout << "generation " << daemon.publish(cpus) << std::endl;
        } else if (command == "restart") {
            uint64_t generation = 0;
            std::string cpus;
            words >> generation >> cpus;
            daemon.stop();
            if (!daemon.start(generation, cpus, &error)) {
                std::fprintf(stderr, "mall_fake_daemon: cannot restart: %s\n", error.c_str());
                return 1;
            }
            std::cout << "generation " << daemon.generation() << std::endl;
        } else if (command == "attaches") {
            std::cout << "attaches " << daemon.attach_count() << std::endl;
        } else if (command == "quit") {
            break;
        } else {
            std::cout << "unknown command: " << line << std::endl;
        }
    }
    daemon.stop();
    return 0;
}
