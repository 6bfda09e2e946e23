// An enumeration's values with their names, listed once in a table that every direction reads:
// the name of a value, the value of a name (parsers, files read back) and all values in order. A
// value missing from its table has no name ("?" or the caller's fallback), so a new enumerator
// goes into its table where the enumeration is declared.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "dlprobe/core/status.h"

namespace dlprobe {

template <class E>
struct Named {
  E value;
  std::string_view name;
};

template <class E, std::size_t N>
constexpr std::string_view name_of(const Named<E> (&table)[N], E value,
                                   std::string_view fallback = "?") {
  for (const Named<E>& e : table) {
    if (e.value == value) return e.name;
  }
  return fallback;
}

template <class E, std::size_t N>
constexpr std::optional<E> value_named(const Named<E> (&table)[N], std::string_view name) {
  for (const Named<E>& e : table) {
    if (e.name == name) return e.value;
  }
  return std::nullopt;
}

// "a, b, c": the names, for an error that says what would have been accepted.
template <class E, std::size_t N>
std::string names_text(const Named<E> (&table)[N]) {
  std::string out;
  for (const Named<E>& e : table) {
    if (!out.empty()) out += ", ";
    out += e.name;
  }
  return out;
}

// value_named, refusing a name the table lacks with the ones it has; `what` names the kind of
// value ("precision"), and which flag or field the text came from is the caller's to add. Plain
// concatenation, not fmt: CUDA sources reach this header (through the allocator's), and nvcc does
// not compile fmt/format.h.
template <class E, std::size_t N>
Result<E> parse_named(const Named<E> (&table)[N], std::string_view text, std::string_view what) {
  if (const std::optional<E> value = value_named(table, text)) return *value;
  return invalid_argument("unknown " + std::string(what) + " '" + std::string(text) +
                          "' (expected one of " + names_text(table) + ")");
}

// The values in the table's order.
template <class E, std::size_t N>
constexpr std::array<E, N> values_of(const Named<E> (&table)[N]) {
  std::array<E, N> out{};
  for (std::size_t i = 0; i < N; ++i) out[i] = table[i].value;
  return out;
}

}  // namespace dlprobe
