# SPDX-License-Identifier: BSD-3-Clause
# ManPages.cmake — the man pages malld(8), mallctl(1), mallrun(1), mallsim(1) and mall(3), written
# at build time by mall-help2man (src/tools/man, a build tool, not installed) from the texts users
# already read: each built tool's --help (mallctl's also `mallctl help CMD` for every command its
# --help lists) and mall.h's comments. One source each, so page and text cannot drift (tests/man
# checks it). Output in <build>/man/manN (each page also gzip -9n'd); target `man` (part of ALL); the
# .gz installed under ${CMAKE_INSTALL_MANDIR} (component `man`), as Debian's policy wants. No date in
# the pages and no name or time in the .gz: the same sources give the same bytes.
option(MALL_BUILD_MAN_PAGES "Build and install the man pages (runs the built tools' --help)" ON)
if(NOT MALL_BUILD_MAN_PAGES)
  message(STATUS "mall: man pages off (MALL_BUILD_MAN_PAGES=OFF)")
  return()
endif()
if(CMAKE_CROSSCOMPILING)
  message(STATUS "mall: man pages off (cross-compiling: the built tools cannot run here to print their --help)")
  return()
endif()
message(STATUS "mall: man pages on (<build>/man, installed to ${CMAKE_INSTALL_MANDIR})")

add_executable(mall-help2man
  src/tools/man/help2man_main.cpp
  src/tools/man/roff.cpp
  src/tools/man/help_page.cpp
  src/tools/man/header_page.cpp
  src/common/run_bounded.cpp  # compiled in: the build tool links no mall library
  src/common/files.cpp)       # run_bounded's folder_chain_problem
target_include_directories(mall-help2man PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)

set(mall_man_dir ${PROJECT_BINARY_DIR}/man)
set(mall_man_common --source "mall ${PROJECT_VERSION}" --manual "mall manual"
    --see-also "malld(8)" --see-also "mallctl(1)" --see-also "mallrun(1)" --see-also "mallsim(1)" --see-also "mall(3)")
set(mall_man_pages "")

# mall_man_page(NAME SECTION [DEPENDS files...] ARGS converter arguments...): one page, its rule
# and its install line.
function(mall_man_page name section)
  cmake_parse_arguments(PARSE_ARGV 2 page "" "" "DEPENDS;ARGS")
  set(out ${mall_man_dir}/man${section}/${name}.${section})
  add_custom_command(OUTPUT ${out} ${out}.gz
    COMMAND ${CMAKE_COMMAND} -E make_directory ${mall_man_dir}/man${section}
    COMMAND mall-help2man --name ${name} --section ${section} ${mall_man_common} ${page_ARGS} --output ${out}
    COMMAND sh -c "gzip -9n -c '${out}' > '${out}.gz'"
    DEPENDS mall-help2man ${page_DEPENDS}
    COMMENT "Man page ${name}(${section})"
    VERBATIM)
  set(mall_man_pages ${mall_man_pages} ${out} ${out}.gz PARENT_SCOPE)
  install(FILES ${out}.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man${section} COMPONENT man)
endfunction()

mall_man_page(malld 8 DEPENDS malld ARGS --program $<TARGET_FILE:malld>)
mall_man_page(mallctl 1 DEPENDS mallctl ARGS --program $<TARGET_FILE:mallctl> --commands)
mall_man_page(mallrun 1 DEPENDS mallrun ARGS --program $<TARGET_FILE:mallrun>)
mall_man_page(mallsim 1 DEPENDS mallsim ARGS --program $<TARGET_FILE:mallsim>)
mall_man_page(mall 3 DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/include/mall/mall.h
              ARGS --header ${CMAKE_CURRENT_SOURCE_DIR}/include/mall/mall.h --include-as mall/mall.h)
add_custom_target(man ALL DEPENDS ${mall_man_pages})
