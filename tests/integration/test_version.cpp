// SPDX-License-Identifier: BSD-3-Clause
// Proves there is one version: mall.h's MALL_API_VERSION_* macros, the loaded libmall's
// mall_get_api_version(), the project version CMake used, mallConfigVersion.cmake, the --version of
// malld, mallctl and mallrun, libmall.so's file name and SONAME, and the Python module's
// expectations all agree.
#include <dlfcn.h>
#include <elf.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "mall/mall.h"
#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(60);

#ifndef MALL_PROJECT_VERSION
#error "MALL_PROJECT_VERSION must be the PROJECT_VERSION CMake configured (tests/CMakeLists.txt)"
#endif
#ifndef MALL_CONFIG_VERSION_FILE
#error "MALL_CONFIG_VERSION_FILE must name the generated mallConfigVersion.cmake (tests/CMakeLists.txt)"
#endif

namespace mall::test {
namespace {

namespace fs = std::filesystem;

#define MALL_VERSION_STR_(x) #x
#define MALL_VERSION_STR(x) MALL_VERSION_STR_(x)

// "MAJOR.MINOR.PATCH" from mall.h's macros.
const std::string kHeaderVersion = MALL_VERSION_STR(MALL_API_VERSION_MAJOR) "." MALL_VERSION_STR(
    MALL_API_VERSION_MINOR) "." MALL_VERSION_STR(MALL_API_VERSION_PATCH);
const std::string kHeaderMajor = MALL_VERSION_STR(MALL_API_VERSION_MAJOR);

// The DT_SONAME of an ELF64 shared object, or nullopt when the file is not one or has none.
std::optional<std::string> elf_soname(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto fits = [&](uint64_t off, uint64_t len) { return off <= bytes.size() && len <= bytes.size() - off; };
    if (!fits(0, sizeof(Elf64_Ehdr))) return std::nullopt;
    Elf64_Ehdr eh;
    std::memcpy(&eh, bytes.data(), sizeof eh);
    if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64) return std::nullopt;
    auto section = [&](unsigned i) -> std::optional<Elf64_Shdr> {
        uint64_t off = eh.e_shoff + uint64_t{i} * eh.e_shentsize;
        if (i >= eh.e_shnum || eh.e_shentsize < sizeof(Elf64_Shdr) || !fits(off, sizeof(Elf64_Shdr)))
            return std::nullopt;
        Elf64_Shdr sh;
        std::memcpy(&sh, bytes.data() + off, sizeof sh);
        return sh;
    };
    for (unsigned i = 0; i < eh.e_shnum; ++i) {
        auto dyn = section(i);
        if (!dyn || dyn->sh_type != SHT_DYNAMIC) continue;
        auto strtab = section(dyn->sh_link);
        if (!strtab || !fits(dyn->sh_offset, dyn->sh_size) || !fits(strtab->sh_offset, strtab->sh_size))
            return std::nullopt;
        for (uint64_t off = 0; off + sizeof(Elf64_Dyn) <= dyn->sh_size; off += sizeof(Elf64_Dyn)) {
            Elf64_Dyn d;
            std::memcpy(&d, bytes.data() + dyn->sh_offset + off, sizeof d);
            if (d.d_tag == DT_NULL) break;
            if (d.d_tag != DT_SONAME || d.d_un.d_val >= strtab->sh_size) continue;
            const char *name = bytes.data() + strtab->sh_offset + d.d_un.d_val;
            return std::string(name, strnlen(name, strtab->sh_size - d.d_un.d_val));
        }
    }
    return std::nullopt;
}

// The path libmall was loaded from (as the dynamic loader named it).
std::string loaded_libmall() {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void *>(&mall_get_api_version), &info) == 0 || info.dli_fname == nullptr)
        return "";
    return info.dli_fname;
}

TEST(Version, TheLoadedLibraryIsTheHeadersVersion) {
    EXPECT_EQ(mall_get_api_version(), MALL_API_VERSION);
    EXPECT_EQ(MALL_API_VERSION,
              MALL_API_VERSION_MAJOR * 10000 + MALL_API_VERSION_MINOR * 100 + MALL_API_VERSION_PATCH);
}

TEST(Version, CMakesProjectAndPackageVersionAreTheHeadersVersion) {
    EXPECT_EQ(std::string(MALL_PROJECT_VERSION), kHeaderVersion);
    std::string config = read_file(MALL_CONFIG_VERSION_FILE);
    ASSERT_FALSE(config.empty()) << "cannot read " << MALL_CONFIG_VERSION_FILE;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(config, m, std::regex(R"re(set\(PACKAGE_VERSION "([^"]*)"\))re"))) << config;
    EXPECT_EQ(m[1].str(), kHeaderVersion) << MALL_CONFIG_VERSION_FILE;
}

TEST(Version, EveryToolPrintsTheHeadersVersion) {
    for (const char *tool : {"malld", "mallctl", "mallrun"}) {
        auto r = run_command({bin_path(tool), "--version"});
        EXPECT_EQ(r.exit_code, 0) << tool << ": " << r.err;
        auto lines = split_lines(r.out);
        ASSERT_FALSE(lines.empty()) << tool << " --version printed nothing; stderr: " << r.err;
        EXPECT_EQ(lines[0], std::string(tool) + " (mall) " + kHeaderVersion) << tool;
    }
}

TEST(Version, LibmallFileIsNamedForTheVersionAndItsSonameForTheMajor) {
    std::string loaded = loaded_libmall();
    ASSERT_FALSE(loaded.empty()) << "dladdr found no library holding mall_get_api_version";
    std::error_code ec;
    fs::path real = fs::canonical(loaded, ec);
    ASSERT_FALSE(ec) << loaded << ": " << ec.message();
    EXPECT_EQ(real.filename().string(), "libmall.so." + kHeaderVersion) << "loaded " << loaded;
    auto soname = elf_soname(real.string());
    ASSERT_TRUE(soname.has_value()) << real << " has no DT_SONAME";
    EXPECT_EQ(*soname, "libmall.so." + kHeaderMajor) << real;
    // The loader found it by that name (the linker recorded the SONAME as DT_NEEDED).
    EXPECT_EQ(fs::path(loaded).filename().string(), *soname) << "loaded " << loaded;
}

TEST(Version, ThePythonModuleExpectsTheHeadersMajor) {
    std::string library_py = read_file(std::string(MALL_SOURCE_DIR) + "/python/mall/_library.py");
    ASSERT_FALSE(library_py.empty());
    std::smatch m;
    ASSERT_TRUE(std::regex_search(library_py, m, std::regex(R"re(\nEXPECTED_API_MAJOR = (\d+))re")));
    EXPECT_EQ(m[1].str(), kHeaderMajor) << "python/mall/_library.py EXPECTED_API_MAJOR";
    ASSERT_TRUE(std::regex_search(library_py, m, std::regex(R"re(\n_LIBRARY_NAMES = \("([^"]+)")re")));
    EXPECT_EQ(m[1].str(), "libmall.so." + kHeaderMajor) << "python/mall/_library.py _LIBRARY_NAMES";
}

}  // namespace
}  // namespace mall::test
