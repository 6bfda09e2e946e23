// The largest batch that passes a test (it runs, it fits a memory limit), found one probe at a
// time, so that the caller runs each probe its own way (a child process, a simulation, a measured
// step), records what it likes and may stop at any point:
//
//   BatchSearch search(options);
//   while (auto batch = search.next()) search.report(*batch, passes(*batch));
//
// From the guess the search walks away in steps that double, upward while probes pass and
// downward while they fail, until a pass and a failure bracket the boundary; then it bisects
// between them to the granularity. Every probe lies strictly between the largest batch that passed
// and the smallest that failed, so the answer passed and the batch above it (to the granularity)
// failed, even where the test is not monotone.
#pragma once

#include <cstdint>
#include <optional>

namespace dlprobe {

struct BatchSearchOptions {
  std::int64_t guess = 1;  // the first probe, moved into [lower, upper]
  // No probe goes below `lower` (at least 1): when it fails, no batch passed.
  std::int64_t lower = 1;
  // No probe goes above `upper` (at least `lower`): when it passes, it is the answer.
  std::int64_t upper = std::int64_t{1} << 16;
  // The first step away from the guess; each further step is twice the last. A first step equal to
  // the guess doubles the batch on the way up (16, 32, 64...); 1 costs two probes for a good guess
  // (it and the batch above it).
  std::int64_t first_step = 1;
  // Every probe is a multiple of this (at least 1): `lower`, `guess` and `first_step` are rounded
  // up to one, `upper` down (a caller checks that a multiple lies between lower and upper). The
  // search ends once the smallest failure is within it of the largest pass.
  std::int64_t granularity = 1;
  // At most this many probes; none: as many as the search needs.
  std::optional<int> max_probes;
};

class BatchSearch {
 public:
  explicit BatchSearch(const BatchSearchOptions& options);

  // The batch to probe next, or nullopt when the search is over.
  std::optional<std::int64_t> next() const;
  // The outcome of the probe of `batch`, the one next() gave.
  void report(std::int64_t batch, bool passed);

  std::optional<std::int64_t> largest_passed() const { return passed_; }
  std::optional<std::int64_t> smallest_failed() const { return failed_; }
  int probes() const { return probes_; }
  // True when a batch passed and the answer is exact to the granularity: the batch above it
  // failed, or it is `upper` (not cut short by max_probes).
  bool converged() const;

 private:
  BatchSearchOptions o_;
  std::int64_t step_;  // the next step of the walk away from the guess
  int probes_ = 0;
  std::optional<std::int64_t> passed_;
  std::optional<std::int64_t> failed_;
};

}  // namespace dlprobe
