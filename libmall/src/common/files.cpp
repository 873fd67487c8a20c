// SPDX-License-Identifier: BSD-3-Clause
// files.cpp — see files.hpp. Plain POSIX calls, EINTR retried, descriptors close-on-exec.
#include "files.hpp"

#include <fcntl.h>
#include <sys/random.h>
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

int create_temp_file(const std::string &prefix, unsigned mode, std::string *path) {
    static const char kLetters[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    for (int attempt = 0; attempt < 16; ++attempt) {
        unsigned char random[16];
        size_t got = 0;
        while (got < sizeof random) {
            const ssize_t n = ::getrandom(random + got, sizeof random - got, 0);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) return -1;
            got += static_cast<size_t>(n);
        }
        std::string name = prefix + ".tmp.";
        for (unsigned char byte : random) name += kLetters[byte % (sizeof kLetters - 1)];
        const int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                              static_cast<mode_t>(mode));
        if (fd < 0) {
            if (errno == EEXIST) continue;  // taken (planted or not): draw another name
            return -1;
        }
        // The umask must not narrow the mode a reader (node_exporter, another user) relies on.
        if (::fchmod(fd, static_cast<mode_t>(mode)) != 0) {
            const int err = errno;
            ::close(fd);
            ::unlink(name.c_str());
            errno = err;
            return -1;
        }
        *path = std::move(name);
        return fd;
    }
    errno = EEXIST;
    return -1;
}

bool replace_file_atomically(const std::string &path, const std::string &text, unsigned mode,
                             std::string *error) {
    std::string temp;
    auto fail = [&](const std::string &what) {
        const int err = errno;
        if (!temp.empty()) ::unlink(temp.c_str());
        if (error) *error = what + ": " + std::strerror(err);
        return false;
    };
    // A new file of ours under a name nobody can guess, never one planted there (the folder may
    // be shared).
    const int fd = create_temp_file(path, mode, &temp);
    if (fd < 0) return fail("cannot create a temporary file next to " + path);
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

std::string private_folder_problem(const std::string &path, uid_t owner, bool *missing) {
    if (missing) *missing = false;
    struct stat st{};
    if (::lstat(path.c_str(), &st) != 0) {
        if (errno == ENOENT) {
            if (missing) *missing = true;
            return "";
        }
        return "cannot read " + path + ": " + std::strerror(errno);
    }
    if (S_ISLNK(st.st_mode)) return path + " is a symbolic link: give the real folder";
    if (!S_ISDIR(st.st_mode)) return path + " is not a folder";
    if (st.st_uid != owner)
        return path + " belongs to uid " + std::to_string(st.st_uid) + ", not to uid " + std::to_string(owner) +
               " (malld's)";
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
        char mode[8];
        std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
        return path + " is writable by " + ((st.st_mode & S_IWOTH) ? "others" : "its group") + " (mode " + mode + ")";
    }
    return "";
}

std::string absolute_path_problem(const std::string &path) {
    if (path.empty() || path[0] != '/') return "is not an absolute path";
    if (path.size() > 4096) return "is longer than 4096 bytes";
    if (path.find('\0') != std::string::npos) return "holds a NUL byte";
    if (path == "/") return "";
    if (path.back() == '/') return "ends with '/'";
    for (size_t start = 1; start <= path.size();) {
        size_t end = path.find('/', start);
        if (end == std::string::npos) end = path.size();
        const std::string part = path.substr(start, end - start);
        if (part.empty()) return "has an empty component ('//')";
        if (part == "." || part == "..") return "has a '" + part + "' component";
        start = end + 1;
    }
    return "";
}

}  // namespace mall
