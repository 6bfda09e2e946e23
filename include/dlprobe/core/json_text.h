// JSON text from a file of unknown origin (a results file, a tuning cache, one edited by hand) as
// a value, with what nlohmann's own parser lacks for such a file: a bound on the nesting, the JSON
// path of a number out of range, and a key given twice refused rather than the last one kept.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string_view>

#include "dlprobe/core/status.h"

namespace dlprobe {

// The deepest file dlprobe writes nests arrays and objects about ten levels; the bound keeps a
// hostile file from building a value that nlohmann's recursive copy, comparison and dump would
// overflow the stack on, and from taking memory and time in proportion to a deep nesting.
inline constexpr std::size_t kMaxJsonDepth = 128;

// The value of `text`; Errc::invalid_argument names the JSON path or the byte where it went wrong
// ("configurations[2].settings.model: the key is given twice in its object", "truncated JSON (the
// file ends early) at byte 120").
Result<nlohmann::json> parse_json(std::string_view text);

}  // namespace dlprobe
