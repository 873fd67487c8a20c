// SPDX-License-Identifier: BSD-3-Clause
// files.cpp — see files.hpp. Plain POSIX calls, EINTR retried, descriptors close-on-exec.
#include "files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace mall {

bool read_text_file(const std::string &path, std::string *out, int *err) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (err) *err = errno;
        return false;
    }
    out->clear();
    char buf[4096];
    for (;;) {
        ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0) {
            if (errno == EINTR) continue;
            const int saved = errno;
            ::close(fd);
            if (err) *err = saved;
            errno = saved;
            return false;
        }
        if (n == 0) break;
        out->append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    return true;
}

bool replace_file_atomically(const std::string &path, const std::string &text, unsigned mode,
                             std::string *error) {
    const std::string temp = path + ".tmp." + std::to_string(::getpid());
    auto fail = [&](const std::string &what) {
        const int err = errno;
        ::unlink(temp.c_str());
        if (error) *error = what + ": " + std::strerror(err);
        return false;
    };
    // A new file of ours, never one planted under that name (the folder may be shared).
    ::unlink(temp.c_str());
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd < 0) return fail("cannot create " + temp);
    // The umask must not narrow the mode a reader (node_exporter, another user) relies on.
    if (::fchmod(fd, mode) != 0) {
        ::close(fd);
        return fail("cannot set the mode of " + temp);
    }
    size_t done = 0;
    while (done < text.size()) {
        const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            ::close(fd);
            return fail("cannot write " + temp);
        }
        done += static_cast<size_t>(n);
    }
    if (::close(fd) != 0) return fail("cannot write " + temp);
    if (::rename(temp.c_str(), path.c_str()) != 0) return fail("cannot rename " + temp + " to " + path);
    return true;
}

int write_file_once(const std::string &path, const std::string &value) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    ssize_t n;
    do {
        n = ::write(fd, value.data(), value.size());
    } while (n < 0 && errno == EINTR);
    const int err = n < 0 ? errno : 0;
    ::close(fd);
    return err;
}

bool make_directories(const std::string &path, unsigned mode, std::string *failed) {
    for (size_t pos = 1; pos <= path.size(); ++pos) {
        if (pos != path.size() && path[pos] != '/') continue;
        const std::string prefix = path.substr(0, pos);
        if (::mkdir(prefix.c_str(), static_cast<mode_t>(mode)) == 0 || errno == EEXIST) continue;
        if (failed) *failed = prefix;
        return false;
    }
    return true;
}

}  // namespace mall
