// SPDX-License-Identifier: BSD-3-Clause
// test_protocol.cpp — proves the wire format round-trips and that decode() rejects every kind of bad
// packet with words that say what was wrong; also the typed getters and job-name validation.
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/protocol.hpp"
#include "support/watchdog.h"

namespace proto = mall::proto;

namespace {

MALL_TEST_WATCHDOG(60);

// A packet with a hand-made header, for the cases encode() refuses to produce.
std::string raw_packet(uint32_t magic, uint16_t version, uint16_t type, uint32_t length, uint32_t id,
                       const std::string &payload) {
    std::string packet(proto::kHeaderSize, '\0');
    std::memcpy(&packet[0], &magic, 4);
    std::memcpy(&packet[4], &version, 2);
    std::memcpy(&packet[6], &type, 2);
    std::memcpy(&packet[8], &length, 4);
    std::memcpy(&packet[12], &id, 4);
    return packet + payload;
}

std::string raw_packet(const std::string &payload, uint16_t type = 6) {
    return raw_packet(proto::kMagic, proto::kVersion, type, static_cast<uint32_t>(payload.size()), 7, payload);
}

// Decodes a packet that must be rejected and returns the reason.
std::string rejection(const std::string &packet) {
    std::string error;
    auto msg = proto::decode(packet, &error);
    EXPECT_FALSE(msg.has_value()) << "accepted a bad packet";
    EXPECT_FALSE(error.empty()) << "rejection without words";
    return error;
}

}  // namespace

TEST(Protocol, RoundTripKeepsTypeIdAndBody) {
    proto::Message msg;
    msg.type = proto::Type::Register;
    msg.request_id = 0xdeadbeef;
    msg.body = {{"job", "train-1"}, {"uid", 1000}, {"pids", {1, 2, 3}}, {"min", 1}, {"max", 4}, {"weight", 1.5}};
    std::string packet = proto::encode(msg);
    ASSERT_EQ(packet.size(), proto::kHeaderSize + msg.body.dump().size());

    std::string error;
    auto decoded = proto::decode(packet, &error);
    ASSERT_TRUE(decoded.has_value()) << error;
    EXPECT_EQ(decoded->type, proto::Type::Register);
    EXPECT_EQ(decoded->request_id, 0xdeadbeefu);
    EXPECT_EQ(decoded->body, msg.body);
}

TEST(Protocol, EveryKnownTypeRoundTrips) {
    for (uint16_t t = 0; t < 200; ++t) {
        if (!proto::is_known_type(t)) continue;
        proto::Message msg;
        msg.type = static_cast<proto::Type>(t);
        auto decoded = proto::decode(proto::encode(msg), nullptr);
        ASSERT_TRUE(decoded.has_value()) << "type " << t;
        EXPECT_EQ(static_cast<uint16_t>(decoded->type), t);
        EXPECT_STRNE(proto::type_name(decoded->type), "unknown");
    }
    EXPECT_FALSE(proto::is_known_type(0));
    EXPECT_TRUE(proto::is_known_type(12));  // Usage
    EXPECT_TRUE(proto::is_known_type(13));  // Record
    EXPECT_STREQ(proto::type_name(proto::Type::Record), "Record");
    EXPECT_FALSE(proto::is_known_type(14));
    EXPECT_FALSE(proto::is_known_type(63));
    EXPECT_FALSE(proto::is_known_type(67));
}

TEST(Protocol, EmptyObjectPayloadIsFine) {
    auto decoded = proto::decode(raw_packet("{}"), nullptr);
    ASSERT_TRUE(decoded.has_value());
    EXPECT_TRUE(decoded->body.is_object());
    EXPECT_TRUE(decoded->body.empty());
}

TEST(Protocol, EncodeRefusesOversizedPayload) {
    proto::Message msg;
    msg.type = proto::Type::Status;
    msg.body = {{"blob", std::string(proto::kMaxPayload, 'x')}};
    EXPECT_THROW(proto::encode(msg), std::length_error);
}

TEST(Protocol, EncodeSurvivesInvalidUtf8) {
    proto::Message msg;
    msg.type = proto::Type::Reply;
    msg.body = {{"error", std::string("bad \xff\xfe name")}};
    std::string packet;
    EXPECT_NO_THROW(packet = proto::encode(msg));
    EXPECT_TRUE(proto::decode(packet, nullptr).has_value());
}

TEST(Protocol, RejectsTruncatedHeader) {
    EXPECT_NE(rejection("").find("truncated"), std::string::npos);
    std::string error = rejection(raw_packet("{}").substr(0, 15));
    EXPECT_NE(error.find("truncated"), std::string::npos) << error;
    EXPECT_NE(error.find("15 bytes"), std::string::npos) << error;
}

TEST(Protocol, RejectsTruncatedPayload) {
    std::string packet = raw_packet("{\"job\":\"a\"}");
    std::string error = rejection(packet.substr(0, packet.size() - 3));
    EXPECT_NE(error.find("truncated payload"), std::string::npos) << error;
}

TEST(Protocol, RejectsOversizedLength) {
    std::string error = rejection(
        raw_packet(proto::kMagic, proto::kVersion, 6, static_cast<uint32_t>(proto::kMaxPayload + 1), 1, "{}"));
    EXPECT_NE(error.find("oversized"), std::string::npos) << error;
    EXPECT_NE(error.find(std::to_string(proto::kMaxPayload)), std::string::npos) << error;
}

TEST(Protocol, RejectsUnknownType) {
    std::string error = rejection(raw_packet("{}", 42));
    EXPECT_NE(error.find("unknown message type 42"), std::string::npos) << error;
}

TEST(Protocol, RejectsOtherVersion) {
    std::string error = rejection(raw_packet(proto::kMagic, 2, 6, 2, 1, "{}"));
    EXPECT_NE(error.find("the peer speaks mall protocol version 2 and this program speaks version 1"), std::string::npos) << error;
}

TEST(Protocol, RejectsBadMagic) {
    std::string error = rejection(raw_packet(0x12345678, proto::kVersion, 6, 2, 1, "{}"));
    EXPECT_NE(error.find("bad magic"), std::string::npos) << error;
    EXPECT_NE(error.find("0x12345678"), std::string::npos) << error;
}

TEST(Protocol, RejectsTrailingBytes) {
    std::string packet = raw_packet(proto::kMagic, proto::kVersion, 6, 2, 1, "{}xyz");
    std::string error = rejection(packet);
    EXPECT_NE(error.find("trailing bytes"), std::string::npos) << error;
    EXPECT_NE(error.find("3 bytes"), std::string::npos) << error;
}

TEST(Protocol, RejectsInvalidJson) {
    std::string error = rejection(raw_packet("{\"job\": "));
    EXPECT_NE(error.find("invalid JSON"), std::string::npos) << error;
    error = rejection(raw_packet("{job: 1}"));
    EXPECT_NE(error.find("invalid JSON"), std::string::npos) << error;
}

// Regression (found by tests/fuzz/fuzz_protocol_decode): a number beyond a double's range made
// nlohmann throw out_of_range, not parse_error; it escaped decode() and ended malld ("fatal: ...
// number overflow"). Any local client could stop the daemon with one packet.
TEST(Protocol, NumberOverflowIsInvalidJsonNotAnException) {
    for (const char *payload : {"{\"a\":1E400}", "{\"a\":-1e9551616}", "{\"pids\":[1,2e308000]}"}) {
        std::string error;
        proto::DecodeFailure failure;
        std::optional<proto::Message> msg;
        EXPECT_NO_THROW(msg = proto::decode(raw_packet(payload), &error, &failure)) << payload;
        EXPECT_FALSE(msg.has_value()) << payload;
        EXPECT_EQ(failure.reason, proto::DecodeError::InvalidJson) << payload;
        EXPECT_NE(error.find("invalid JSON"), std::string::npos) << payload << ": " << error;
    }
    EXPECT_TRUE(proto::decode(raw_packet("{\"a\":1E300}"), nullptr).has_value());
}

TEST(Protocol, RejectsNonObjectJson) {
    for (const char *payload : {"[1,2]", "\"text\"", "42", "null", "true"}) {
        std::string error = rejection(raw_packet(payload));
        EXPECT_NE(error.find("must be a JSON object"), std::string::npos) << payload << ": " << error;
    }
}

TEST(Protocol, ReplyBuilders) {
    auto ok = proto::ok_reply({{"job", "a"}});
    EXPECT_EQ(ok["ok"], true);
    EXPECT_EQ(ok["job"], "a");
    EXPECT_EQ(proto::ok_reply()["ok"], true);
    auto err = proto::error_reply(-3, "not yours");
    EXPECT_EQ(err["ok"], false);
    EXPECT_EQ(err["code"], -3);
    EXPECT_EQ(err["error"], "not yours");
}

// Runs f, which must throw ProtocolError, and returns its message.
template <typename F>
std::string protocol_error(F f) {
    try {
        f();
    } catch (const proto::ProtocolError &e) {
        return e.what();
    }
    ADD_FAILURE() << "no ProtocolError thrown";
    return "";
}

TEST(Protocol, GettersReturnValues) {
    nlohmann::json body = {{"job", "a"}, {"min", 2}, {"big", 18446744073709551615ull}, {"none", nullptr}};
    EXPECT_EQ(proto::get_string(body, "job"), "a");
    EXPECT_EQ(proto::get_optional_string(body, "job"), "a");
    EXPECT_EQ(proto::get_optional_string(body, "absent"), std::nullopt);
    EXPECT_EQ(proto::get_optional_string(body, "none"), std::nullopt);
    EXPECT_EQ(proto::get_int(body, "min", 1, 10), 2);
    EXPECT_EQ(proto::get_optional_int(body, "min", 1, 10), 2);
    EXPECT_EQ(proto::get_optional_int(body, "absent", 1, 10), std::nullopt);
    EXPECT_EQ(proto::get_uint(body, "min"), 2u);
    EXPECT_EQ(proto::get_uint(body, "big"), 18446744073709551615ull);
}

TEST(Protocol, GetterErrorsNameTheField) {
    nlohmann::json body = {{"job", 5}, {"min", "two"}, {"max", 0}, {"neg", -1}, {"frac", 1.5}, {"big", 18446744073709551615ull}};
    std::string e = protocol_error([&] { proto::get_string(body, "missing_one"); });
    EXPECT_NE(e.find("\"missing_one\""), std::string::npos) << e;
    EXPECT_NE(e.find("missing"), std::string::npos) << e;
    e = protocol_error([&] { proto::get_string(body, "job"); });
    EXPECT_NE(e.find("\"job\""), std::string::npos) << e;
    EXPECT_NE(e.find("string"), std::string::npos) << e;
    e = protocol_error([&] { proto::get_optional_string(body, "job"); });
    EXPECT_NE(e.find("\"job\""), std::string::npos) << e;
    e = protocol_error([&] { proto::get_int(body, "min", 1, 10); });
    EXPECT_NE(e.find("\"min\""), std::string::npos) << e;
    e = protocol_error([&] { proto::get_int(body, "max", 1, 10); });
    EXPECT_NE(e.find("\"max\""), std::string::npos) << e;
    EXPECT_NE(e.find("between 1 and 10"), std::string::npos) << e;
    e = protocol_error([&] { proto::get_int(body, "frac", 0, 10); });
    EXPECT_NE(e.find("\"frac\""), std::string::npos) << e;
    e = protocol_error([&] { proto::get_int(body, "big", 0, 10); });
    EXPECT_NE(e.find("\"big\""), std::string::npos) << e;
    e = protocol_error([&] { proto::get_optional_int(body, "neg", 0, 10); });
    EXPECT_NE(e.find("\"neg\""), std::string::npos) << e;
    e = protocol_error([&] { proto::get_uint(body, "neg"); });
    EXPECT_NE(e.find("\"neg\""), std::string::npos) << e;
    EXPECT_NE(e.find("non-negative"), std::string::npos) << e;
    e = protocol_error([&] { proto::get_uint(body, "min"); });
    EXPECT_NE(e.find("\"min\""), std::string::npos) << e;
    e = protocol_error([&] { proto::get_uint(body, "nothing"); });
    EXPECT_NE(e.find("\"nothing\""), std::string::npos) << e;
}

TEST(Protocol, JobNameValidation) {
    EXPECT_EQ(proto::invalid_job_name("a"), std::nullopt);
    EXPECT_EQ(proto::invalid_job_name("train-1.run_2:x"), std::nullopt);
    EXPECT_EQ(proto::invalid_job_name(std::string(64, 'j')), std::nullopt);

    auto empty = proto::invalid_job_name("");
    ASSERT_TRUE(empty.has_value());
    EXPECT_NE(empty->find("empty"), std::string::npos) << *empty;
    auto too_long = proto::invalid_job_name(std::string(65, 'j'));
    ASSERT_TRUE(too_long.has_value());
    EXPECT_NE(too_long->find("65"), std::string::npos) << *too_long;
    auto slash = proto::invalid_job_name("a/b");
    ASSERT_TRUE(slash.has_value());
    EXPECT_NE(slash->find("'/'"), std::string::npos) << *slash;
    EXPECT_NE(slash->find("position 2"), std::string::npos) << *slash;
    for (const char *bad : {"a b", "../x", "x\n", "é", "a;b", "$HOME"})
        EXPECT_TRUE(proto::invalid_job_name(bad).has_value()) << bad;
}

// Issue 11 (error text used as an API): callers act on decode()'s reason, never on its words;
// ctl_client once classified a reply by looking for "protocol version" at the start of the text.
TEST(Protocol, EachRejectionCarriesItsReason) {
    using proto::DecodeError;
    struct Case {
        std::string name;
        std::string packet;
        DecodeError reason;
    };
    const std::string job = raw_packet("{\"job\":\"a\"}");
    const std::vector<Case> cases = {
        {"empty", "", DecodeError::TruncatedHeader},
        {"15 bytes", raw_packet("{}").substr(0, 15), DecodeError::TruncatedHeader},
        {"bad magic", raw_packet(0x12345678, proto::kVersion, 6, 2, 1, "{}"), DecodeError::BadMagic},
        {"version 2", raw_packet(proto::kMagic, 2, 6, 2, 1, "{}"), DecodeError::OtherVersion},
        {"type 42", raw_packet("{}", 42), DecodeError::UnknownType},
        {"oversized",
         raw_packet(proto::kMagic, proto::kVersion, 6, static_cast<uint32_t>(proto::kMaxPayload + 1), 1, "{}"),
         DecodeError::Oversized},
        {"short payload", job.substr(0, job.size() - 3), DecodeError::TruncatedPayload},
        {"trailing", raw_packet(proto::kMagic, proto::kVersion, 6, 2, 1, "{}xyz"), DecodeError::TrailingBytes},
        {"bad json", raw_packet("{\"job\": "), DecodeError::InvalidJson},
        {"array", raw_packet("[1,2]"), DecodeError::NotAnObject},
    };
    for (const Case &c : cases) {
        std::string error;
        proto::DecodeFailure failure;
        // Start from a reason the case does not expect, so that a decode() that forgets to set it fails.
        failure.reason =
            c.reason == DecodeError::TruncatedHeader ? DecodeError::NotAnObject : DecodeError::TruncatedHeader;
        EXPECT_FALSE(proto::decode(c.packet, &error, &failure).has_value()) << c.name;
        EXPECT_EQ(failure.reason, c.reason) << c.name << ": " << error;
        EXPECT_FALSE(error.empty()) << c.name;
        EXPECT_EQ(proto::decode_error_code(failure.reason),
                  c.reason == DecodeError::OtherVersion ? MALL_ERR_VERSION : MALL_ERR_PROTOCOL)
            << c.name;
        // The reason alone, without the words.
        proto::DecodeFailure alone;
        alone.reason = failure.reason == DecodeError::TruncatedHeader ? DecodeError::NotAnObject
                                                                      : DecodeError::TruncatedHeader;
        EXPECT_FALSE(proto::decode(c.packet, nullptr, &alone).has_value()) << c.name;
        EXPECT_EQ(alone.reason, c.reason) << c.name;
    }
}

// A peer of another version is recognized from its magic and version alone, whatever the rest of
// its header (the client used to check that itself before decode(); decode() now does it first).
TEST(Protocol, OtherVersionIsRecognizedBeforeTheHeaderLength) {
    std::string error;
    proto::DecodeFailure failure;
    EXPECT_FALSE(proto::decode(raw_packet(proto::kMagic, 7, 6, 2, 1, "{}"), &error, &failure).has_value());
    EXPECT_EQ(failure.reason, proto::DecodeError::OtherVersion);
    EXPECT_EQ(failure.version, 7);
    EXPECT_NE(error.find("protocol version 7"), std::string::npos) << error;
    for (size_t size : {size_t{6}, size_t{8}, size_t{15}}) {
        const std::string head = raw_packet(proto::kMagic, 3, 6, 2, 1, "{}").substr(0, size);
        failure = {};
        EXPECT_FALSE(proto::decode(head, &error, &failure).has_value()) << size;
        EXPECT_EQ(failure.reason, proto::DecodeError::OtherVersion) << size << " bytes: " << error;
        EXPECT_EQ(failure.version, 3) << size;
    }
    // Too short to hold the version, or of this version: truncated.
    for (const std::string &head : {raw_packet(proto::kMagic, 3, 6, 2, 1, "{}").substr(0, 5),
                                    raw_packet(proto::kMagic, proto::kVersion, 6, 2, 1, "{}").substr(0, 8)}) {
        failure = {};
        failure.reason = proto::DecodeError::NotAnObject;
        EXPECT_FALSE(proto::decode(head, &error, &failure).has_value());
        EXPECT_EQ(failure.reason, proto::DecodeError::TruncatedHeader) << head.size() << " bytes: " << error;
    }
}

TEST(Protocol, JobNameCharactersAndLength) {
    EXPECT_EQ(proto::kMaxJobNameLength, 64u);
    std::string allowed;
    for (int c = 0; c < 256; ++c) {
        const char ch = static_cast<char>(c);
        if (proto::is_job_name_char(ch)) allowed += ch;
        // mallrun's default job names use the character rule: it must agree with the name rule.
        EXPECT_EQ(proto::is_job_name_char(ch), !proto::invalid_job_name(std::string(1, ch)).has_value()) << c;
    }
    EXPECT_EQ(allowed, "-.0123456789:ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz");
}
