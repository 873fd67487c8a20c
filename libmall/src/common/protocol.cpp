// SPDX-License-Identifier: BSD-3-Clause
// protocol.cpp — encoding and strict decoding of malld's wire messages (see protocol.hpp).
// Contract: decode() accepts exactly one well-formed packet of this protocol version and reports
// every rejection as a DecodeError plus words; the typed getters name the field that is missing or wrong.
#include "common/protocol.hpp"

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace mall::proto {

namespace {

// The header as it travels: host byte order (both ends are on the same host).
struct WireHeader {
    uint32_t magic;
    uint16_t version;
    uint16_t type;
    uint32_t length;
    uint32_t request_id;
};
static_assert(sizeof(WireHeader) == kHeaderSize, "the wire header is 16 bytes");

std::string json_type_name(const nlohmann::json &value) {
    if (value.is_number_integer()) return "an integer";
    if (value.is_number_float()) return "a number with a fraction";
    if (value.is_string()) return "a string";
    if (value.is_boolean()) return "a boolean";
    if (value.is_null()) return "null";
    if (value.is_array()) return "an array";
    if (value.is_object()) return "an object";
    return value.type_name();
}

const nlohmann::json *find_field(const nlohmann::json &body, const char *field) {
    if (!body.is_object()) return nullptr;
    auto it = body.find(field);
    if (it == body.end()) return nullptr;
    return &*it;
}

// Reads an integer field, accepting both signed and unsigned JSON integers.
int64_t checked_int(const nlohmann::json &value, const char *field, int64_t min, int64_t max) {
    std::string range = "between " + std::to_string(min) + " and " + std::to_string(max);
    if (value.is_number_unsigned()) {
        uint64_t u = value.get<uint64_t>();
        if (u > static_cast<uint64_t>(INT64_MAX) || static_cast<int64_t>(u) > max || static_cast<int64_t>(u) < min)
            throw ProtocolError("field \"" + std::string(field) + "\" must be an integer " + range +
                                ", got " + std::to_string(u));
        return static_cast<int64_t>(u);
    }
    if (value.is_number_integer()) {
        int64_t v = value.get<int64_t>();
        if (v < min || v > max)
            throw ProtocolError("field \"" + std::string(field) + "\" must be an integer " + range +
                                ", got " + std::to_string(v));
        return v;
    }
    throw ProtocolError("field \"" + std::string(field) + "\" must be an integer " + range + ", got " +
                        json_type_name(value));
}

}  // namespace

bool is_known_type(uint16_t t) {
    return (t >= static_cast<uint16_t>(Type::Register) && t <= static_cast<uint16_t>(Type::Record)) ||
           (t >= static_cast<uint16_t>(Type::Reply) && t <= static_cast<uint16_t>(Type::Notify));
}

const char *type_name(Type t) {
    switch (t) {
        case Type::Register: return "Register";
        case Type::Deregister: return "Deregister";
        case Type::Attach: return "Attach";
        case Type::Ack: return "Ack";
        case Type::Progress: return "Progress";
        case Type::Status: return "Status";
        case Type::Set: return "Set";
        case Type::Policy: return "Policy";
        case Type::Reclaim: return "Reclaim";
        case Type::Release: return "Release";
        case Type::Watch: return "Watch";
        case Type::Usage: return "Usage";
        case Type::Record: return "Record";
        case Type::Reply: return "Reply";
        case Type::Event: return "Event";
        case Type::Notify: return "Notify";
    }
    return "unknown";
}

std::string encode(const Message &msg) {
    // Invalid UTF-8 in a string (a job name from a bad client, say) is replaced, never thrown on.
    std::string payload = msg.body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (payload.size() > kMaxPayload)
        throw std::length_error("message payload of " + std::to_string(payload.size()) +
                                " bytes exceeds the protocol limit of " + std::to_string(kMaxPayload) +
                                " bytes");
    WireHeader header{kMagic, kVersion, static_cast<uint16_t>(msg.type),
                      static_cast<uint32_t>(payload.size()), msg.request_id};
    std::string packet(kHeaderSize + payload.size(), '\0');
    std::memcpy(packet.data(), &header, kHeaderSize);
    std::memcpy(packet.data() + kHeaderSize, payload.data(), payload.size());
    return packet;
}

std::optional<Message> decode(std::string_view packet, std::string *error, DecodeFailure *failure) {
    auto fail = [&](DecodeError reason, std::string why) -> std::optional<Message> {
        if (failure) failure->reason = reason;
        if (error) *error = std::move(why);
        return std::nullopt;
    };
    // The magic and the version first: they sit at the same place in every version, the rest of
    // the header may not.
    constexpr size_t kVersionEnd = offsetof(WireHeader, version) + sizeof(WireHeader::version);
    if (packet.size() >= kVersionEnd) {
        uint32_t magic;
        uint16_t version;
        std::memcpy(&magic, packet.data() + offsetof(WireHeader, magic), sizeof magic);
        std::memcpy(&version, packet.data() + offsetof(WireHeader, version), sizeof version);
        if (magic == kMagic && version != kVersion) {
            if (failure) failure->version = version;
            return fail(DecodeError::OtherVersion,
                        "the peer speaks mall protocol version " + std::to_string(version) +
                            " and this program speaks version " + std::to_string(kVersion) +
                            "; use malld, libmall and the tools from the same release");
        }
    }
    if (packet.size() < kHeaderSize)
        return fail(DecodeError::TruncatedHeader, "truncated packet: " + std::to_string(packet.size()) +
                                                      " bytes, shorter than the 16-byte message header");
    WireHeader header;
    std::memcpy(&header, packet.data(), kHeaderSize);
    if (header.magic != kMagic) {
        char hex[16];
        std::snprintf(hex, sizeof hex, "0x%08x", header.magic);
        return fail(DecodeError::BadMagic,
                    std::string("bad magic ") + hex + " (expected \"MALL\"): not a mall message");
    }
    if (!is_known_type(header.type))
        return fail(DecodeError::UnknownType, "unknown message type " + std::to_string(header.type));
    if (header.length > kMaxPayload)
        return fail(DecodeError::Oversized, "oversized payload: header says " + std::to_string(header.length) +
                                                " bytes, the limit is " + std::to_string(kMaxPayload));
    size_t available = packet.size() - kHeaderSize;
    if (available < header.length)
        return fail(DecodeError::TruncatedPayload, "truncated payload: header says " + std::to_string(header.length) +
                                                       " bytes, the packet holds " + std::to_string(available));
    if (available > header.length)
        return fail(DecodeError::TrailingBytes, "trailing bytes: " + std::to_string(available - header.length) +
                                                    " bytes after the " + std::to_string(header.length) +
                                                    "-byte payload");

    Message msg;
    msg.type = static_cast<Type>(header.type);
    msg.request_id = header.request_id;
    std::string_view payload = packet.substr(kHeaderSize, header.length);
    // nlohmann throws more than parse_error: a number beyond a double's range ({"a":1E400}) is an
    // out_of_range (406), which escaped decode() and ended malld (found by fuzz_protocol_decode).
    try {
        msg.body = nlohmann::json::parse(payload.begin(), payload.end());
    } catch (const nlohmann::json::exception &e) {
        return fail(DecodeError::InvalidJson,
                    std::string("invalid JSON payload in ") + type_name(msg.type) + " message: " + e.what());
    }
    if (!msg.body.is_object())
        return fail(DecodeError::NotAnObject, std::string("payload of ") + type_name(msg.type) +
                                                  " message must be a JSON object, got " +
                                                  json_type_name(msg.body));
    return msg;
}

uint32_t request_id_of(std::string_view packet) {
    if (packet.size() < kHeaderSize) return 0;
    WireHeader header;
    std::memcpy(&header, packet.data(), kHeaderSize);
    return header.request_id;
}

int decode_error_code(DecodeError reason) {
    return reason == DecodeError::OtherVersion ? MALL_ERR_VERSION : MALL_ERR_PROTOCOL;
}

nlohmann::json ok_reply(nlohmann::json fields) {
    if (!fields.is_object()) fields = nlohmann::json::object();
    fields["ok"] = true;
    return fields;
}

nlohmann::json error_reply(int code, const std::string &text) {
    return nlohmann::json{{"ok", false}, {"code", code}, {"error", text}};
}

bool is_error_code(int64_t code) { return code <= MALL_ERR_INVAL && code >= MALL_ERR_FULL; }

ReplyOutcome read_reply(const nlohmann::json &body, const char *request_name) {
    ReplyOutcome outcome;
    auto ok = body.find("ok");
    if (ok == body.end() || !ok->is_boolean()) {
        outcome.malformed = true;
        outcome.code = MALL_ERR_PROTOCOL;
        outcome.error = std::string("malld's reply to the ") + request_name + " request has no boolean \"ok\" field";
        return outcome;
    }
    outcome.ok = ok->get<bool>();
    if (outcome.ok) return outcome;
    auto code = body.find("code");
    outcome.code = (code != body.end() && code->is_number_integer() && is_error_code(code->get<int64_t>()))
                       ? static_cast<int>(code->get<int64_t>())
                       : MALL_ERR_PROTOCOL;
    auto text = body.find("error");
    outcome.error = (text != body.end() && text->is_string() && !text->get<std::string>().empty())
                        ? text->get<std::string>()
                        : std::string("malld refused the ") + request_name + " request without saying why";
    return outcome;
}

std::string get_string(const nlohmann::json &body, const char *field) {
    const nlohmann::json *value = find_field(body, field);
    if (!value) throw ProtocolError("missing field \"" + std::string(field) + "\" (a string)");
    if (!value->is_string())
        throw ProtocolError("field \"" + std::string(field) + "\" must be a string, got " + json_type_name(*value));
    return value->get<std::string>();
}

std::optional<std::string> get_optional_string(const nlohmann::json &body, const char *field) {
    const nlohmann::json *value = find_field(body, field);
    if (!value || value->is_null()) return std::nullopt;
    if (!value->is_string())
        throw ProtocolError("field \"" + std::string(field) + "\" must be a string, got " + json_type_name(*value));
    return value->get<std::string>();
}

int64_t get_int(const nlohmann::json &body, const char *field, int64_t min, int64_t max) {
    const nlohmann::json *value = find_field(body, field);
    if (!value) throw ProtocolError("missing field \"" + std::string(field) + "\" (an integer)");
    return checked_int(*value, field, min, max);
}

std::optional<int64_t> get_optional_int(const nlohmann::json &body, const char *field, int64_t min,
                                        int64_t max) {
    const nlohmann::json *value = find_field(body, field);
    if (!value || value->is_null()) return std::nullopt;
    return checked_int(*value, field, min, max);
}

uint64_t get_uint(const nlohmann::json &body, const char *field) {
    const nlohmann::json *value = find_field(body, field);
    if (!value) throw ProtocolError("missing field \"" + std::string(field) + "\" (a non-negative integer)");
    if (value->is_number_unsigned()) return value->get<uint64_t>();
    if (value->is_number_integer()) {
        int64_t v = value->get<int64_t>();
        if (v >= 0) return static_cast<uint64_t>(v);
        throw ProtocolError("field \"" + std::string(field) + "\" must be a non-negative integer, got " +
                            std::to_string(v));
    }
    throw ProtocolError("field \"" + std::string(field) + "\" must be a non-negative integer, got " +
                        json_type_name(*value));
}

std::optional<std::string> invalid_job_name(std::string_view name) {
    if (name.empty())
        return "a job name must not be empty (use 1-" + std::to_string(kMaxJobNameLength) +
               " characters from A-Z a-z 0-9 . _ : -)";
    if (name.size() > kMaxJobNameLength)
        return "job name is " + std::to_string(name.size()) + " characters long; at most " +
               std::to_string(kMaxJobNameLength) + " are allowed (from A-Z a-z 0-9 . _ : -)";
    for (size_t i = 0; i < name.size(); ++i) {
        unsigned char c = static_cast<unsigned char>(name[i]);
        if (!is_job_name_char(name[i])) {
            char shown[16];
            if (c >= 0x21 && c < 0x7f)
                std::snprintf(shown, sizeof shown, "'%c'", c);
            else
                std::snprintf(shown, sizeof shown, "byte 0x%02x", c);
            return "job name has " + std::string(shown) + " at position " + std::to_string(i + 1) +
                   "; only A-Z a-z 0-9 . _ : - are allowed";
        }
    }
    return std::nullopt;
}

}  // namespace mall::proto
