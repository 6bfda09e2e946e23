// Internal to the report: results files from several machines side by side. A machine is what its
// file's context records of where it ran: host, GPU model, driver, CUDA, and the versions of the
// libraries it loaded (cuDNN, cuBLAS, frameworks); results files record no container image, so an
// image shows through the versions it brought.
#pragma once

#include <nlohmann/json.hpp>

#include <span>
#include <string>

#include "dlprobe/results/table.h"

namespace dlprobe::report {

// Where the files come from more than one machine: a table with a row per configuration and a
// column per machine (throughput with its CI, and its ratio to the row's first machine), each
// column headed by the host, the GPU and what else differs between the machines, and a chart of
// the same (a bar per machine, grouped by configuration), its specification appended to `charts`.
// "" for files of one machine.
std::string fleet_section(std::span<const results::NamedDocument> documents,
                          nlohmann::json& charts);

}  // namespace dlprobe::report
