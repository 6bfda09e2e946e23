// The configuration table of one or more results files: one row per configuration with its
// settings, status, throughput and CI, step-time percentiles, memory, achieved TFLOP/s, and the
// first GPU's median power, energy per item, utilisation and SM clock over the timed window.
// The same table feeds the CSV and Markdown exports, the HTML report and compare, so the columns
// mean the same everywhere. Derived views of a configuration used by several of them live here too.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dlprobe/results/results.h"

namespace dlprobe::results {

// A results document with the name it was read under (the file name), for merged views.
struct NamedDocument {
  std::string name;
  Document document;
};

struct Cell {
  std::string text;              // as shown: "1,234.5", "12.3 ms", "oom"
  std::optional<double> number;  // the value behind it, for sorting and CSV; none for text cells
};

struct Table {
  std::vector<std::string> columns;
  std::vector<std::vector<Cell>> rows;
};

// Rows in file order, then configuration order. A "file" column leads when there is more than one
// document.
Table configuration_table(std::span<const NamedDocument> documents);
// The table less the columns no row has a value in (a CPU run's GPU power, energy, utilisation
// and clock), for a page a person reads; the CSV keeps every column, so that scripts find them.
Table without_empty_columns(const Table& table);

// RFC 4180: a header line, fields with a comma, quote or line break quoted, quotes doubled; numeric
// cells hold the full-precision value, not the rounded text.
std::string to_csv(const Table& table);
// A GitHub-flavoured Markdown table; '|' is escaped and line breaks become spaces.
std::string to_markdown(const Table& table);

// The peak device memory a configuration used, by the best source present: dlprobe's allocator
// (peak allocated bytes), the framework's own figure, else NVML's view of the process.
std::optional<std::int64_t> peak_memory_bytes(const Memory& memory);
// The energy of every GPU the run sampled, together (for energy per item over all the items they
// made); none where no GPU was sampled or one GPU's energy is unknown, which would understate it.
std::optional<double> energy_j(const Configuration& configuration);
// The allocator's breakdown at the overall peak ("peak.allocated_bytes.<category>"), in the
// allocator's category order; empty without allocator statistics. A planned step's arena, one
// block to the allocator, is told as what it holds at its fullest where memory.arena says
// ("arena: activations", "arena: backward gradients", "arena: other temporaries", "arena: free").
std::vector<std::pair<std::string, std::int64_t>> peak_by_category(const Memory& memory);

}  // namespace dlprobe::results
