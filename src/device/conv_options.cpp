#include "dlprobe/device/conv_options.h"

#include <fmt/format.h>

#include <optional>

#include "dlprobe/core/units.h"

namespace dlprobe::device {

Result<ConvEngines> parse_conv_engines(std::string_view text) {
  if (text == "any") return ConvEngines::any;
  if (text == "deterministic") return ConvEngines::deterministic;
  if (text == "exact") return ConvEngines::exact;
  return invalid_argument(
      fmt::format("unknown choice '{}' (expected any, deterministic or exact)", text));
}

Result<ConvSumsBy> parse_conv_sums(std::string_view text) {
  if (text == "epilogue") return ConvSumsBy::epilogue;
  if (text == "pass") return ConvSumsBy::pass;
  if (text == "auto") return ConvSumsBy::epilogue_in_fp16;
  return invalid_argument(
      fmt::format("unknown choice '{}' (expected epilogue, pass or auto)", text));
}

Result<ConvPrologueChoice> parse_conv_prologue(std::string_view text) {
  if (text == "fused") return ConvPrologueChoice{ConvPrologue::fused};
  if (text == "pass") return ConvPrologueChoice{ConvPrologue::pass};
  if (text == "auto") return ConvPrologueChoice{ConvPrologue::automatic};
  if (text == "timed") return ConvPrologueChoice{ConvPrologue::timed};
  constexpr std::string_view kUpTo = "up-to:";
  if (text.starts_with(kUpTo)) {
    DLPROBE_ASSIGN_OR_RETURN(const std::uint64_t bytes,
                             parse_size(text.substr(kUpTo.size()), "up-to"));
    return ConvPrologueChoice{ConvPrologue::up_to, bytes};
  }
  return invalid_argument(
      fmt::format("unknown choice '{}' (expected fused, pass, auto, timed or up-to:SIZE)", text));
}

void set_prologue_routes(const ConvPrologueChoice& choice, CudaBackendOptions& cuda) {
  cuda.conv_prologue_pass = choice.mode == ConvPrologue::pass;
  cuda.conv_prologue_timed =
      choice.mode == ConvPrologue::timed || choice.mode == ConvPrologue::automatic;
  cuda.conv_prologue_pass_up_to_bytes = std::nullopt;
  cuda.conv_prologue_size_rule_up_to_batch = std::nullopt;
  if (choice.mode == ConvPrologue::up_to) cuda.conv_prologue_pass_up_to_bytes = choice.up_to_bytes;
  if (choice.mode == ConvPrologue::automatic) {
    cuda.conv_prologue_pass_up_to_bytes = kAutoPrologueUpTo;
    cuda.conv_prologue_size_rule_up_to_batch = kAutoPrologueBatch;
  }
}

Result<ConvEngineChoice> parse_conv_algo(std::string_view text) {
  for (ConvEngineChoice c :
       {ConvEngineChoice::heuristic, ConvEngineChoice::autotune, ConvEngineChoice::exhaustive}) {
    if (text == conv_engine_choice_name(c)) return c;
  }
  return invalid_argument(
      fmt::format("unknown choice '{}' (expected heuristic, autotune or exhaustive)", text));
}

}  // namespace dlprobe::device
