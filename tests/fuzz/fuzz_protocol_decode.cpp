// SPDX-License-Identifier: BSD-3-Clause
// fuzz_protocol_decode.cpp — libFuzzer target for proto::decode(), malld's reader of every packet a
// local client sends (and libmall's reader of malld's). Input: one packet as it arrives on the socket.
// Checked besides "no crash, leak, throw or sanitizer report": every refusal carries words and the
// reason an independent reading of the header predicts; an accepted packet re-encodes to bytes that
// decode to the same message; the typed field getters return values within their bounds or throw
// ProtocolError; invalid_job_name() agrees with the job-name rule on every string the body holds.
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

#include "common/protocol.hpp"
#include "fuzz_check.hpp"

namespace {

using mall::fuzz::shown;
using mall::proto::DecodeError;
using mall::proto::DecodeFailure;
using nlohmann::json;

const char *reason_name(DecodeError reason) {
    switch (reason) {
        case DecodeError::TruncatedHeader: return "TruncatedHeader";
        case DecodeError::BadMagic: return "BadMagic";
        case DecodeError::OtherVersion: return "OtherVersion";
        case DecodeError::UnknownType: return "UnknownType";
        case DecodeError::Oversized: return "Oversized";
        case DecodeError::TruncatedPayload: return "TruncatedPayload";
        case DecodeError::TrailingBytes: return "TrailingBytes";
        case DecodeError::InvalidJson: return "InvalidJson";
        case DecodeError::NotAnObject: return "NotAnObject";
    }
    return "?";
}

template <class T>
T read_at(std::string_view packet, size_t offset) {
    T value;
    std::memcpy(&value, packet.data() + offset, sizeof value);
    return value;
}

// The protocol as protocol.hpp states it, read independently of protocol.cpp: the reason a
// packet must be refused for, or nothing when it must be accepted.
std::optional<DecodeError> expected_refusal(std::string_view packet) {
    if (packet.size() >= 6 && read_at<uint32_t>(packet, 0) == mall::proto::kMagic &&
        read_at<uint16_t>(packet, 4) != mall::proto::kVersion)
        return DecodeError::OtherVersion;
    if (packet.size() < 16) return DecodeError::TruncatedHeader;
    if (read_at<uint32_t>(packet, 0) != mall::proto::kMagic) return DecodeError::BadMagic;
    uint16_t type = read_at<uint16_t>(packet, 6);
    if (!((type >= 1 && type <= 13) || (type >= 64 && type <= 66))) return DecodeError::UnknownType;
    uint32_t length = read_at<uint32_t>(packet, 8);
    if (length > 64 * 1024) return DecodeError::Oversized;
    size_t available = packet.size() - 16;
    if (available < length) return DecodeError::TruncatedPayload;
    if (available > length) return DecodeError::TrailingBytes;
    std::string_view payload = packet.substr(16);
    if (!json::accept(payload.begin(), payload.end())) return DecodeError::InvalidJson;
    if (!json::parse(payload.begin(), payload.end()).is_object()) return DecodeError::NotAnObject;
    return std::nullopt;
}

bool job_name_rule(std::string_view name) {
    static constexpr std::string_view allowed =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-";
    if (name.empty() || name.size() > 64) return false;
    for (char c : name)
        if (allowed.find(c) == std::string_view::npos) return false;
    return true;
}

// Every typed getter on one field: a value within the asked bounds, or ProtocolError exactly
// when the field is missing or not of that kind and range. (The getters take a C string: a key
// with a NUL byte is looked up up to that byte.)
void check_getters(const json &body, const std::string &full_key) {
    const std::string key = full_key.c_str();
    const char *field = key.c_str();
    const json *value = body.contains(key) ? &body.at(key) : nullptr;
    auto integer_within = [&](int64_t lo, int64_t hi) {
        if (!value || !value->is_number_integer()) return false;
        if (value->is_number_unsigned()) {
            uint64_t u = value->get<uint64_t>();
            return u <= static_cast<uint64_t>(hi) && (lo <= 0 || u >= static_cast<uint64_t>(lo));
        }
        int64_t v = value->get<int64_t>();
        return v >= lo && v <= hi;
    };
    try {
        std::string s = mall::proto::get_string(body, field);
        MALL_FUZZ_CHECK(value && value->is_string() && s == value->get<std::string>(), "get_string on " + key);
    } catch (const mall::proto::ProtocolError &) {
        MALL_FUZZ_CHECK(!value || !value->is_string(), "get_string refused a string field " + key);
    }
    try {
        auto s = mall::proto::get_optional_string(body, field);
        MALL_FUZZ_CHECK(s.has_value() == (value && value->is_string()), "get_optional_string on " + key);
    } catch (const mall::proto::ProtocolError &) {
        MALL_FUZZ_CHECK(value && !value->is_string() && !value->is_null(), "get_optional_string threw on " + key);
    }
    try {
        int64_t v = mall::proto::get_int(body, field, -7, 1024);
        MALL_FUZZ_CHECK(v >= -7 && v <= 1024 && integer_within(-7, 1024), "get_int on " + key);
    } catch (const mall::proto::ProtocolError &) {
        MALL_FUZZ_CHECK(!integer_within(-7, 1024), "get_int refused an integer within bounds in " + key);
    }
    try {
        auto v = mall::proto::get_optional_int(body, field, 0, mall::proto::kMaxPid);
        if (v) MALL_FUZZ_CHECK(*v >= 0 && *v <= mall::proto::kMaxPid, "get_optional_int on " + key);
        else MALL_FUZZ_CHECK(!value || value->is_null(), "get_optional_int gave nothing for " + key);
    } catch (const mall::proto::ProtocolError &) {
        MALL_FUZZ_CHECK(value && !value->is_null(), "get_optional_int threw on a missing " + key);
    }
    try {
        uint64_t v = mall::proto::get_uint(body, field);
        MALL_FUZZ_CHECK(integer_within(0, INT64_MAX) || (value && value->is_number_unsigned()), "get_uint on " + key);
        (void)v;
    } catch (const mall::proto::ProtocolError &) {
        MALL_FUZZ_CHECK(!integer_within(0, INT64_MAX) && !(value && value->is_number_unsigned()),
                        "get_uint refused a non-negative integer in " + key);
    }
    if (value && value->is_string()) {
        const std::string &name = value->get_ref<const std::string &>();
        auto why = mall::proto::invalid_job_name(name);
        MALL_FUZZ_CHECK(why.has_value() != job_name_rule(name), "invalid_job_name disagrees on " + shown(name));
        MALL_FUZZ_CHECK(!why || !why->empty(), "invalid_job_name gave no words");
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    std::string_view packet(reinterpret_cast<const char *>(data), size);
    std::string error;
    DecodeFailure failure;
    failure.reason = DecodeError::NotAnObject;
    auto msg = mall::proto::decode(packet, &error, &failure);
    auto quiet = mall::proto::decode(packet, nullptr, nullptr);  // either pointer may be null
    MALL_FUZZ_CHECK(msg.has_value() == quiet.has_value(), "decode's answer depends on its out-pointers");

    MALL_FUZZ_CHECK(mall::proto::request_id_of(packet) == (size >= 16 ? read_at<uint32_t>(packet, 12) : 0u),
                    "request_id_of disagrees with the header");

    auto expected = expected_refusal(packet);
    if (!msg) {
        MALL_FUZZ_CHECK(!error.empty(), "a refusal without words");
        MALL_FUZZ_CHECK(expected && *expected == failure.reason,
                        std::string("refused as ") + reason_name(failure.reason) + ", expected " +
                            (expected ? reason_name(*expected) : "acceptance") + ": " + error);
        if (failure.reason == DecodeError::OtherVersion)
            MALL_FUZZ_CHECK(failure.version == read_at<uint16_t>(packet, 4), "OtherVersion names the wrong version");
        int code = mall::proto::decode_error_code(failure.reason);
        MALL_FUZZ_CHECK(code == (failure.reason == DecodeError::OtherVersion ? MALL_ERR_VERSION : MALL_ERR_PROTOCOL),
                        "decode_error_code");
        return 0;
    }
    MALL_FUZZ_CHECK(!expected, std::string("accepted a packet that must be refused as ") + reason_name(*expected));
    MALL_FUZZ_CHECK(msg->body.is_object(), "an accepted body that is not an object");
    MALL_FUZZ_CHECK(static_cast<uint16_t>(msg->type) == read_at<uint16_t>(packet, 6), "type differs from the header");
    MALL_FUZZ_CHECK(msg->request_id == read_at<uint32_t>(packet, 12), "request id differs from the header");
    MALL_FUZZ_CHECK(std::string(mall::proto::type_name(msg->type)) != "unknown", "a known type without a name");

    // Re-encoding: the compact dump may outgrow the limit (numbers like 1E5 print as 100000.0),
    // and then encode() must say so by std::length_error; otherwise the bytes decode to the same
    // message, and encoding that gives the same bytes again.
    std::string again;
    try {
        again = mall::proto::encode(*msg);
    } catch (const std::length_error &) {
        MALL_FUZZ_CHECK(msg->body.dump(-1, ' ', false, json::error_handler_t::replace).size() > mall::proto::kMaxPayload,
                        "encode() refused a payload within the limit");
        return 0;
    }
    std::string why;
    auto back = mall::proto::decode(again, &why);
    MALL_FUZZ_CHECK(back.has_value(), "an encoded message does not decode: " + why);
    MALL_FUZZ_CHECK(back->type == msg->type && back->request_id == msg->request_id, "header changed in a round trip");
    MALL_FUZZ_CHECK(back->body == msg->body, "body changed in a round trip: " + shown(again.substr(16)));
    MALL_FUZZ_CHECK(mall::proto::encode(*back) == again, "encoding is not stable");

    for (const auto &item : msg->body.items()) check_getters(msg->body, item.key());
    check_getters(msg->body, "job");  // usually missing: the getters' "missing field" paths
    return 0;
}
