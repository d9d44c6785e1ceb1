#include <zinf/util.hpp>

#include <nlohmann/json.hpp>

#include <istream>
#include <set>
#include <vector>

namespace zinf::json {

Value::Value() : v_(std::make_unique<Json>(Json::object())) {}
Value::Value(const Json& v) : v_(std::make_unique<Json>(v)) {}
Value::Value(Json&& v) : v_(std::make_unique<Json>(std::move(v))) {}
Value::Value(const Value& o) : v_(std::make_unique<Json>(*o.v_)) {}
// A moved-from Value holds nothing: it may only be assigned to or destroyed.
Value::Value(Value&& o) noexcept : v_(std::move(o.v_)) {}
Value& Value::operator=(const Value& o) {
    if (this != &o) v_ = std::make_unique<Json>(*o.v_);
    return *this;
}
Value& Value::operator=(Value&& o) noexcept {
    v_.swap(o.v_);
    return *this;
}
Value::~Value() = default;
bool operator==(const Value& a, const Value& b) { return *a.v_ == *b.v_; }

// Strings that are not UTF-8 (a path is just bytes) are written with U+FFFD
// in place of the bad bytes rather than failing the whole record.
std::string line(const Json& record) {
    return record.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
}

Json parse_untrusted(std::string_view text, const ParseLimits& limits) {
    std::uint64_t values = 0;
    std::vector<std::set<std::string>> keys;  // of each object open, innermost last
    auto on_event = [&](int depth, Json::parse_event_t event, Json& parsed) {
        using E = Json::parse_event_t;
        if (event == E::object_start || event == E::array_start || event == E::value) {
            if (static_cast<unsigned>(depth) > limits.depth)
                throw DataError("JSON nested deeper than " + std::to_string(limits.depth) + " levels");
            if (++values > limits.values)
                throw DataError("JSON of more than " + std::to_string(limits.values) + " values");
        }
        if (event == E::object_start) keys.emplace_back();
        if (event == E::object_end && !keys.empty()) keys.pop_back();
        if (event == E::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second)
            throw DataError("the key \"" + parsed.get<std::string>() + "\" appears twice in one object");
        return true;
    };
    return Json::parse(text, on_event);
}

Json parse_line(std::string_view text, const std::string& source, std::size_t line_no) {
    try {
        Json j;
        try {
            j = parse_untrusted(text);
        } catch (const DataError& e) {
            throw DataError("line " + std::to_string(line_no) + ": " + e.message(), {0, source, {}, -1});
        }
        if (!j.is_object())
            throw DataError("line " + std::to_string(line_no) + ": a record must be a JSON object",
                            {0, source, {}, -1});
        return j;
    } catch (const Json::exception& e) {
        // parse_error, and out_of_range for a number past a double ("1e999"): both are bad data.
        throw DataError("line " + std::to_string(line_no) + ": invalid JSON: " + e.what(),
                        {0, source, {}, -1});
    }
}

std::vector<Json> read_lines(std::istream& in, const std::string& source) {
    std::vector<Json> out;
    std::string text;
    std::size_t n = 0;
    while (std::getline(in, text)) {
        ++n;
        if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
        out.push_back(parse_line(text, source, n));
    }
    if (in.bad()) throw IoError("read failed", {errno, source, {}, -1});
    return out;
}

std::uint64_t get_u64(const Json& obj, const std::string& key, const std::string& where) {
    auto it = obj.find(key);
    if (it == obj.end()) throw DataError(where + ": missing key '" + key + "'");
    if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<std::int64_t>() >= 0))
        throw DataError(where + ": key '" + key + "' must be a non-negative integer, got " +
                        it->dump());
    return it->get<std::uint64_t>();
}

std::string get_string(const Json& obj, const std::string& key, const std::string& where) {
    auto it = obj.find(key);
    if (it == obj.end()) throw DataError(where + ": missing key '" + key + "'");
    if (!it->is_string())
        throw DataError(where + ": key '" + key + "' must be a string, got " + it->dump());
    return it->get<std::string>();
}

}  // namespace zinf::json
