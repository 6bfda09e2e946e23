#include "dlprobe/core/json_text.h"

#include <fmt/format.h>

#include <string>
#include <utility>
#include <vector>

namespace dlprobe {

using json = nlohmann::json;

namespace {

// Builds the value as nlohmann's own DOM parser does, from its SAX events with the open containers
// on a vector (no recursion), and adds what that parser lacks for a file from anywhere:
// - a bound on the nesting: nlohmann's copy, comparison and dump recurse, and a value nested
//   100,000 deep overflows the stack in them; refused here it is never built;
// - the JSON path of a number beyond a double's range, which nlohmann reports as an exception (not
//   a parse_error) that names neither the place nor the field.
// Errors come back through parse_error's return value, so nothing is thrown.
class BoundedDomBuilder final : public json::json_sax_t {
 public:
  BoundedDomBuilder(json& root, std::string_view text) : root_(root), text_size_(text.size()) {}

  // The error that stopped the parse.
  const std::string& failure() const { return failure_; }

  bool null() override { return put(nullptr); }
  bool boolean(bool value) override { return put(value); }
  bool number_integer(number_integer_t value) override { return put(value); }
  bool number_unsigned(number_unsigned_t value) override { return put(value); }
  bool number_float(number_float_t value, const string_t& /*text*/) override { return put(value); }
  bool string(string_t& value) override { return put(std::move(value)); }
  // Binary values come only from the binary formats (CBOR, MessagePack), never from JSON text.
  bool binary(binary_t& /*value*/) override { return false; }
  bool start_object(std::size_t /*elements*/) override { return open(json::object()); }
  bool key(string_t& key) override {
    open_.back().key = key;
    // nlohmann keeps the last of a key given twice; which one a writer meant is unknown.
    if (open_.back().value->contains(key)) {
      failure_ = fmt::format("{}: the key is given twice in its object", path_of_next(kPathParts));
      return false;
    }
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t /*elements*/) override { return open(json::array()); }
  bool end_array() override { return close(); }

  bool parse_error(std::size_t byte, const std::string& /*token*/,
                   const json::exception& e) override {
    // 406 is the lexer's "number overflow": a literal whose value is not a finite double (1e400,
    // or an integer of more digits than 64 bits hold and a double reaches).
    constexpr int kNumberOverflow = 406;
    if (e.id == kNumberOverflow) {
      failure_ = fmt::format("{}: number out of range", path_of_next(open_.size()));
    } else {
      // The parser reports one past the end when the input stopped in the middle of a value.
      failure_ = fmt::format(
          "{} at byte {}",
          byte > text_size_ ? "truncated JSON (the file ends early)" : "invalid JSON", byte);
    }
    return false;
  }

 private:
  struct Open {
    json* value;
    std::string key;  // of the member being read, in an object
  };

  // Where the next value goes: the top level, the end of the open array, or the open object's key.
  json& slot() {
    if (open_.empty()) return root_;
    Open& top = open_.back();
    if (top.value->is_array()) {
      top.value->push_back(nullptr);
      return top.value->back();
    }
    return (*top.value)[top.key];
  }

  bool put(json&& value) {
    slot() = std::move(value);
    return true;
  }

  bool open(json&& container) {
    if (open_.size() == kMaxJsonDepth) {
      failure_ = fmt::format("{}: nested deeper than {} levels of arrays and objects (the limit)",
                             path_of_next(kPathParts), kMaxJsonDepth);
      return false;
    }
    json& at = slot();
    at = std::move(container);
    open_.push_back({&at, {}});
    return true;
  }

  bool close() {
    open_.pop_back();
    return true;
  }

  // The JSON path of the value about to be read, as the reader's errors write it; past `parts`
  // levels it ends in "..." (at the depth limit the whole path would be hundreds of "[0]").
  std::string path_of_next(std::size_t parts) const {
    if (open_.empty()) return "top level";
    std::string path;
    for (std::size_t i = 0; i < open_.size(); ++i) {
      if (i == parts) return path + "...";
      const Open& o = open_[i];
      if (o.value->is_array()) {
        // The value being read is not in its array yet; every one before it is.
        const bool innermost = i + 1 == open_.size();
        path += fmt::format("[{}]", o.value->size() - (innermost ? 0 : 1));
      } else {
        path += path.empty() ? o.key : "." + o.key;
      }
    }
    return path;
  }

  // Enough to say where in the document a too deep value starts.
  static constexpr std::size_t kPathParts = 16;

  json& root_;
  std::size_t text_size_;
  std::vector<Open> open_;
  std::string failure_;
};

}  // namespace

Result<json> parse_json(std::string_view text) {
  json v;
  BoundedDomBuilder builder(v, text);
  if (!json::sax_parse(text, &builder)) return invalid_argument(builder.failure());
  return v;
}

}  // namespace dlprobe
