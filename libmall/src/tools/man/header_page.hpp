// SPDX-License-Identifier: BSD-3-Clause
// header_page.hpp — mall(3) from the public header mall.h: its opening comment is the
// DESCRIPTION, each comment-led group of declarations (a blank line ends a group) an entry under
// MACROS, TYPES or FUNCTIONS with its declarations verbatim and its comment as text, and every
// $MALL_* variable the comments mention an ENVIRONMENT entry made of the sentences that mention it.
// Contract: a public name (mall_* function or type, MALL_* macro) declared without a comment
// above its group is an error, so an undocumented addition fails the build.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tools/man/roff.hpp"

namespace mall::man {

// Throws std::runtime_error naming the header's line when it cannot be read as described above.
// include_as is the #include line's path ("mall/mall.h"); the SYNOPSIS links with -l<header.name>
// and find_package(<name>) / <name>::<name>.
std::string render_header_page(std::string_view header_text, std::string_view include_as, const PageHeader &header,
                               const std::vector<std::string> &see_also_pages);

}  // namespace mall::man
