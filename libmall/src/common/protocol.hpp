// SPDX-License-Identifier: BSD-3-Clause
// protocol.hpp — the wire format between malld and its clients (libmall, mallctl, mallrun, plugin).
// Transport: a Unix SOCK_SEQPACKET socket, one message per packet. A message is a 16-byte header
// (magic "MALL", version, type, payload length, request id; little-endian host order, same host)
// followed by a JSON object of exactly `length` bytes. decode() rejects truncated packets, bad
// magic, other versions, unknown types, payloads over kMaxPayload, trailing bytes, non-object
// JSON; each rejection carries a reason callers act on (DecodeError) and words for people.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "rules.hpp"

namespace mall::proto {

constexpr uint32_t kMagic = 0x4C4C414D;  // bytes "MALL"
constexpr uint16_t kVersion = 1;
constexpr size_t kHeaderSize = 16;
constexpr size_t kMaxPayload = 64 * 1024;
constexpr size_t kMaxPacket = kHeaderSize + kMaxPayload;
// A reply whose JSON is over kMaxPayload (the status of a node with many jobs) travels in a
// sealed memfd passed with the packet; the packet's body is {"ok": true, kBodyInFdField: <bytes>}.
// Readers accept such bodies up to kMaxFdBody. malld sends them only on a connection whose client
// said it reads them (a request with kAcceptsBodyFdField true, as every CtlClient request has): an
// older client gets the "reply too large" error it knows instead of a body it would misread.
constexpr const char *kBodyInFdField = "body_in_fd";
constexpr const char *kAcceptsBodyFdField = "accepts_body_in_fd";
constexpr size_t kMaxFdBody = 64ull << 20;

enum class Type : uint16_t {
    // requests (client -> malld). Who may send each (admin / owner / attached / any) is decided in
    // one place, the request table of libmall/src/daemon/access.cpp; the word before each body
    // below repeats it for the reader.
    Register = 1,    // admin: {job, uid, pids:[int], min, max, guaranteed?:"list", weight?:num,
                     //   join?:bool (a further task of a registered job adds its pids),
                     //   cgroup?:"auto"|"own"|"in-place" (where malld enforces it; default auto),
                     //   slurm_node_index?, slurm_nodes? (a Slurm job's: this node's place in it)}
                     //   reply (deferred until the job holds cpus): {job, cpus, generation}
    Deregister = 2,  // admin: {job, pid?}   (pid: remove one pid; job ends when none is left)
    Attach = 3,      // owner: {job?:str, min?:int, max?:int} -> reply {job, generation} + page fd
    Ack = 4,         // attached: {generation}            (no reply)
    Progress = 5,    // attached: {work_units:uint, steps:uint}  totals since attach (no reply)
    Status = 6,      // any:   {} -> reply: the status object (see NodeManager::status())
    Set = 7,         // admin: {job, cpus?:"list"|"auto", weight?:num, threads?:int|"auto",
                     //   signal_control?:bool} (at least one) -> reply {job, cpus?, weight,
                     //   threads?, signal_control?} (each optional field echoed when given)
    Policy = 8,      // admin: {name} -> reply {policy}
    Reclaim = 9,     // admin: {cpus, owner?:str} reply (deferred until no job holds them) {cpus};
                     //   with owner the cpus stay reserved for the job of that name
    Release = 10,    // admin: {cpus} -> reply {cpus}; or {owner} -> releases the owner's cpus and
                     //   ends its job if still registered -> reply {owner, cpus}
    Watch = 11,      // any:   {} -> reply {} then Event messages until the client hangs up
    Usage = 12,      // attached: {cpus_used:uint}  the job uses only that many of its cpus (0 = all):
                     //   plan it with max = max(min, cpus_used) (no reply)
    Record = 13,     // admin: {job:"slurm-<jobid>"} (malld --slurm) -> reply (deferred until
                     //   slurmctld took the update, at most 10 s) {job, figures, final:bool}:
                     //   the job's figures so far went to its AdminComment (final: its end was
                     //   being recorded, and that update, with its last figures, is the answer)
    // from malld
    Reply = 64,      // {ok:bool, error?:str, code?:int, ...}
    Event = 65,      // {event:str, time:float (s since epoch), ...}
    Notify = 66,     // {generation}: a new allocation is on the page (to attached clients)
};

bool is_known_type(uint16_t t);
const char *type_name(Type t);

struct Message {
    Type type{};
    uint32_t request_id = 0;
    nlohmann::json body = nlohmann::json::object();
};

// Encodes a message; throws std::length_error if the JSON exceeds kMaxPayload.
std::string encode(const Message &msg);

// Why decode() refused a packet. Callers act on this, never on the words: a peer of another
// protocol version is MALL_ERR_VERSION to a client, everything else MALL_ERR_PROTOCOL.
enum class DecodeError : uint8_t {
    TruncatedHeader,   // shorter than the 16-byte header
    BadMagic,          // does not start with "MALL": not a mall message
    OtherVersion,      // a mall message of another protocol version (DecodeFailure::version)
    UnknownType,       // a message type this version does not define
    Oversized,         // the header announces a payload over kMaxPayload
    TruncatedPayload,  // fewer payload bytes than the header announces
    TrailingBytes,     // more payload bytes than the header announces
    InvalidJson,       // the payload is not JSON
    NotAnObject,       // the payload is JSON but not an object
};

struct DecodeFailure {
    DecodeError reason = DecodeError::TruncatedHeader;
    uint16_t version = 0;  // OtherVersion: the protocol version the peer speaks
};

// Decodes one packet. On failure returns std::nullopt, sets *error to words that say what was
// wrong (never empty, and true from either side: "the peer speaks mall protocol version 2 and
// this program speaks version 1; ...") and *failure to the reason. Either pointer may be null. The magic and version are checked before the header's
// length, so a peer of another version is recognized even if its header is laid out differently.
std::optional<Message> decode(std::string_view packet, std::string *error, DecodeFailure *failure = nullptr);

// The request id in a packet's header, also when the packet does not decode (so that an error
// reply can name the request); 0 for a packet shorter than a header.
uint32_t request_id_of(std::string_view packet);

// The mall_rc a client reports for a reply it could not decode: MALL_ERR_VERSION for another
// protocol version, MALL_ERR_PROTOCOL for everything else.
int decode_error_code(DecodeError reason);

// Builders for replies.
nlohmann::json ok_reply(nlohmann::json fields = nlohmann::json::object());
nlohmann::json error_reply(int code, const std::string &text);

// A Reply with this request id answers no request: malld refuses the connection itself (e.g. the
// user has too many connections open), says why, and hangs up. Clients number their requests from
// 1, so they report such a reply's error instead of waiting for their own.
inline constexpr uint32_t kConnectionRefusalId = 0;

// What a Reply body says, read the same way by every client. A body without a boolean "ok" is
// MALL_ERR_PROTOCOL; an error whose code is not a mall_rc error value is MALL_ERR_PROTOCOL too;
// an error without words gets "malld refused the <request> request without saying why".
struct ReplyOutcome {
    bool ok = false;
    bool malformed = false;  // not a reply at all (no boolean "ok"): code is MALL_ERR_PROTOCOL
    int code = 0;       // when !ok: a mall_rc error value
    std::string error;  // when !ok: malld's words, or what was wrong with the reply
};
ReplyOutcome read_reply(const nlohmann::json &body, const char *request_name);
// True for the mall_rc error values of mall.h (MALL_ERR_INVAL .. MALL_ERR_FULL).
bool is_error_code(int64_t code);

// Typed field access for handlers: each throws ProtocolError with a message naming the field.
struct ProtocolError : std::runtime_error {
    using std::runtime_error::runtime_error;
};
std::string get_string(const nlohmann::json &body, const char *field);
std::optional<std::string> get_optional_string(const nlohmann::json &body, const char *field);
int64_t get_int(const nlohmann::json &body, const char *field, int64_t min, int64_t max);
std::optional<int64_t> get_optional_int(const nlohmann::json &body, const char *field, int64_t min,
                                        int64_t max);
uint64_t get_uint(const nlohmann::json &body, const char *field);

// The largest uid and pid a message or the state file may carry (uid -1 means "no uid" to the
// kernel; pids are positive ints).
inline constexpr int64_t kMaxUid = 0xFFFFFFFEll;
inline constexpr int64_t kMaxPid = 0x7FFFFFFF;

// Job names: 1-64 characters from [A-Za-z0-9._:-]. Returns an explanation when invalid.
constexpr size_t kMaxJobNameLength = 64;
constexpr bool is_job_name_char(char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == ':' || c == '-';
}
std::optional<std::string> invalid_job_name(std::string_view name);

// The weight rule lives in rules.hpp (one source for malld, the tools and the Slurm option).
using mall::kMaxWeight;
using mall::kWeightRule;
using mall::valid_weight;

}  // namespace mall::proto
