// SPDX-License-Identifier: BSD-3-Clause
// files.cpp — see files.hpp. Plain POSIX calls, EINTR retried, descriptors close-on-exec.
#include "files.hpp"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <limits.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

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

int create_temp_file_at(int dir_fd, const std::string &prefix, unsigned mode, std::string *name) {
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
        std::string candidate = prefix + ".tmp.";
        for (unsigned char byte : random) candidate += kLetters[byte % (sizeof kLetters - 1)];
        const int fd = ::openat(dir_fd, candidate.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                                static_cast<mode_t>(mode));
        if (fd < 0) {
            if (errno == EEXIST) continue;  // taken (planted or not): draw another name
            return -1;
        }
        // The umask must not narrow the mode a reader (node_exporter, another user) relies on.
        if (::fchmod(fd, static_cast<mode_t>(mode)) != 0) {
            const int err = errno;
            ::close(fd);
            ::unlinkat(dir_fd, candidate.c_str(), 0);
            errno = err;
            return -1;
        }
        *name = std::move(candidate);
        return fd;
    }
    errno = EEXIST;
    return -1;
}

int create_temp_file(const std::string &prefix, unsigned mode, std::string *path) {
    return create_temp_file_at(AT_FDCWD, prefix, mode, path);
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

namespace {

std::string octal_mode(mode_t mode) {
    char text[8];
    std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode & 07777));
    return text;
}

std::string uid_text(uid_t uid) { return "uid " + std::to_string(uid); }

// The owners a folder above a trusted path may have, for messages: "root" or "root or uid N".
std::string trusted_owners(uid_t trusted) {
    return trusted == 0 ? std::string("root") : "root or " + uid_text(trusted) + " (malld's)";
}

// "" when `st`, a folder above a trusted path, may stay as it is: a folder owned by root or
// `trusted` and writable by nobody else, or sticky (others may add names to it, not rename ours).
std::string chain_folder_problem(const struct stat &st, const std::string &folder, uid_t trusted) {
    if (!S_ISDIR(st.st_mode)) return folder + " is not a folder";
    if (st.st_uid != 0 && st.st_uid != trusted)
        return "folder " + folder + " is owned by " + uid_text(st.st_uid) + ", not " + trusted_owners(trusted);
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0)
        return "folder " + folder + " is writable by " + ((st.st_mode & S_IWOTH) ? "others" : "its group") +
               " (mode " + octal_mode(st.st_mode) + ") and not sticky: whoever may write it can rename what lies "
               "in it and put something else in its place";
    return "";
}

// A symlink on the way to a trusted path is followed only when root or `trusted` owns it (in a
// sticky folder anyone may have made it).
std::string chain_link_problem(const struct stat &st, const std::string &link, uid_t trusted) {
    if (st.st_uid != 0 && st.st_uid != trusted)
        return "symbolic link " + link + " is owned by " + uid_text(st.st_uid) + ", not " + trusted_owners(trusted);
    return "";
}

// The folders above an absolute path, nearest first: "/a/b/c" -> "/a/b", "/a", "/".
std::vector<std::string> folders_above(const std::string &path) {
    std::vector<std::string> out;
    std::string p = path;
    while (p.size() > 1) {
        const size_t slash = p.find_last_of('/');
        p = slash == 0 ? "/" : p.substr(0, slash);
        out.push_back(p);
    }
    return out;
}

std::vector<std::string> components(const std::string &path) {
    std::vector<std::string> parts;
    for (size_t start = 0; start <= path.size();) {
        size_t end = path.find('/', start);
        if (end == std::string::npos) end = path.size();
        if (end > start) parts.push_back(path.substr(start, end - start));
        start = end + 1;
    }
    return parts;
}

// An absolute path with "." and ".." taken away by name (for a symlink's target joined to the
// folders already walked, which hold no symlink: ".." there is the real parent).
std::string lexically_resolved(const std::string &path) {
    std::vector<std::string> kept;
    for (const std::string &part : components(path)) {
        if (part == ".") continue;
        if (part == "..") {
            if (!kept.empty()) kept.pop_back();
            continue;
        }
        kept.push_back(part);
    }
    std::string out;
    for (const auto &part : kept) out += "/" + part;
    return out.empty() ? "/" : out;
}

std::mutex g_pinned_mutex;
std::map<std::string, int> g_pinned;

}  // namespace

std::string folder_chain_problem(const std::string &path, uid_t trusted) {
    for (const std::string &dir : folders_above(path)) {
        struct stat st{};
        if (::lstat(dir.c_str(), &st) != 0) return "cannot read folder " + dir + ": " + std::strerror(errno);
        if (S_ISLNK(st.st_mode)) {
            if (std::string problem = chain_link_problem(st, dir, trusted); !problem.empty()) return problem;
            if (::stat(dir.c_str(), &st) != 0) return "cannot read folder " + dir + ": " + std::strerror(errno);
        }
        if (std::string problem = chain_folder_problem(st, dir, trusted); !problem.empty()) return problem;
    }
    return "";
}

std::string normalized_folder_path(const std::string &path, std::string *why) {
    auto refuse = [&](const std::string &what) {
        if (why) *why = what;
        return std::string();
    };
    if (path.empty()) return refuse("is empty");
    if (path[0] != '/') return refuse("is not an absolute path: give one that starts with '/'");
    if (path.find('\0') != std::string::npos) return refuse("holds a NUL byte");
    std::string out;
    for (const std::string &part : components(path)) {
        if (part == "." || part == "..") return refuse("has a '" + part + "' component: give the folder's plain path");
        out += "/" + part;
    }
    if (out.empty()) out = "/";
    if (out.size() > 4096) return refuse("is longer than 4096 bytes");
    return out;
}

int open_private_folder(const std::string &path, uid_t owner, bool create, unsigned mode, std::string *error,
                        bool *missing) {
    if (missing) *missing = false;
    if (error) error->clear();
    int dir = -1;
    auto fail = [&](const std::string &text) {
        const int err = errno;
        if (dir >= 0) ::close(dir);
        if (error) *error = text;
        errno = err;
        return -1;
    };
    auto errno_text = [] { return std::string(": ") + std::strerror(errno); };
    std::string why;
    std::string todo = normalized_folder_path(path, &why);
    if (todo.empty()) return fail(path + " " + why);
    // The walk restarts from "/" after each symlink on the way, with the link's target in its place.
    for (int links = 0;; ++links) {
        if (links > 40) {
            errno = ELOOP;
            return fail("too many symbolic links on the way to " + path);
        }
        const std::vector<std::string> parts = components(todo);
        dir = ::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (dir < 0) return fail("cannot open /" + errno_text());
        struct stat st{};
        if (::fstat(dir, &st) != 0) return fail("cannot read /" + errno_text());
        if (!parts.empty())
            if (std::string problem = chain_folder_problem(st, "/", owner); !problem.empty()) return fail(problem);
        std::string walked;  // the folders opened so far, "" for "/"
        bool followed_link = false;
        for (size_t i = 0; i < parts.size(); ++i) {
            const std::string &name = parts[i];
            const bool last = i + 1 == parts.size();
            const std::string here = walked + "/" + name;
            struct stat entry{};
            bool created = false;
            if (::fstatat(dir, name.c_str(), &entry, AT_SYMLINK_NOFOLLOW) != 0) {
                if (errno != ENOENT) return fail("cannot read " + here + errno_text());
                if (!create) {
                    ::close(dir);
                    if (missing) *missing = true;
                    errno = ENOENT;
                    return -1;
                }
                if (::mkdirat(dir, name.c_str(), static_cast<mode_t>(mode)) == 0) {
                    created = true;
                    // Exactly `mode`, whatever the umask. In a folder only root or `owner` may
                    // change (or a sticky one, where nobody else may rename what we made).
                    (void)::fchmodat(dir, name.c_str(), static_cast<mode_t>(mode), 0);
                } else if (errno != EEXIST) {
                    return fail("cannot create the folder " + here + errno_text());
                }
            } else if (S_ISLNK(entry.st_mode)) {
                if (last) return fail(here + " is a symbolic link: give the real folder");
                if (std::string problem = chain_link_problem(entry, here, owner); !problem.empty())
                    return fail(problem);
                char target[PATH_MAX];
                const ssize_t n = ::readlinkat(dir, name.c_str(), target, sizeof target - 1);
                if (n <= 0) return fail("cannot read the symbolic link " + here + errno_text());
                target[n] = '\0';
                std::string rest;
                for (size_t j = i + 1; j < parts.size(); ++j) rest += "/" + parts[j];
                todo = lexically_resolved((target[0] == '/' ? std::string(target) : walked + "/" + target) + rest);
                ::close(dir);
                dir = -1;
                followed_link = true;
                break;
            }
            const int next = ::openat(dir, name.c_str(), (last ? O_RDONLY : O_PATH) | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (next < 0) {
                if (errno == ENOTDIR || errno == ELOOP) return fail(here + " is not a folder (or was just replaced)");
                return fail("cannot open " + here + errno_text());
            }
            ::close(dir);
            dir = next;
            if (::fstat(dir, &st) != 0) return fail("cannot read " + here + errno_text());
            if (!last) {
                if (std::string problem = chain_folder_problem(st, here, owner); !problem.empty()) return fail(problem);
            } else {
                if (st.st_uid != owner)
                    return fail(here + " belongs to " + uid_text(st.st_uid) + ", not to " + uid_text(owner) + " (malld's)");
                if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
                    return fail(here + " is writable by " + ((st.st_mode & S_IWOTH) ? "others" : "its group") +
                                " (mode " + octal_mode(st.st_mode) + ")");
                if (created) (void)::fchmod(dir, static_cast<mode_t>(mode));
            }
            walked = here;
        }
        if (followed_link) continue;
        if (parts.empty()) {  // "/" itself: reopen it readable (O_PATH cannot be fsync'ed)
            ::close(dir);
            dir = ::open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (dir < 0) return fail("cannot open /" + errno_text());
            if (::fstat(dir, &st) != 0 || st.st_uid != owner || (st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
                return fail("/ is not a folder of " + uid_text(owner) + "'s alone");
        }
        return dir;
    }
}

void pin_folder(const std::string &path, int fd) {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    auto [it, added] = g_pinned.emplace(path, fd);
    if (!added) {
        if (it->second >= 0 && it->second != fd) ::close(it->second);
        it->second = fd;
    }
}

int pinned_folder(const std::string &path) {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    auto it = g_pinned.find(path);
    return it == g_pinned.end() ? -1 : it->second;
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
