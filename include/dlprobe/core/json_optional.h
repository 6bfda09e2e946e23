// std::optional in nlohmann::json (and ordered_json): an empty optional is written as null, a set
// one as its value, so a figure that was not measured reads as null in every JSON file. The
// nlohmann/json that Debian ships (3.11.2) converts no std::optional itself.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>

namespace nlohmann {

template <class T>
struct adl_serializer<std::optional<T>> {
  template <class Json>
  static void to_json(Json& j, const std::optional<T>& v) {
    if (v) {
      j = *v;
    } else {
      j = nullptr;
    }
  }
};

}  // namespace nlohmann
