# SPDX-License-Identifier: BSD-3-Clause
"""_errors.py — the return codes of mall.h and the MallError exception that carries them.

Contract: the constants have the values of enum mall_rc; MallError(code, text) keeps both, and its
message names the code, so a log line says what failed without a lookup.
"""

from __future__ import annotations

MALL_SUCCESS = 0
MALL_NOUPDT = 1
MALL_ERR_INVAL = -1
MALL_ERR_NODAEMON = -2
MALL_ERR_DENIED = -3
MALL_ERR_NOJOB = -4
MALL_ERR_PROTOCOL = -5
MALL_ERR_NOMEM = -6
MALL_ERR_SYSTEM = -7
MALL_ERR_DETACHED = -8
MALL_ERR_VERSION = -9
MALL_ERR_FULL = -10

CODE_NAMES = {
    value: name
    for name, value in globals().items()
    if name.startswith("MALL_") and isinstance(value, int)
}


class MallError(Exception):
    """A libmall call failed. `code` is one of the MALL_ERR_* values, `text` the library's words."""

    def __init__(self, code: int, text: str):
        self.code = code
        self.name = CODE_NAMES.get(code, f"mall error {code}")
        self.text = text
        super().__init__(f"{text} ({self.name})")
