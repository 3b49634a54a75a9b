// HistoSpec core: a reward-aware suffix automaton over one prompt's previous responses, and the
// per-sequence drafting state machine (prefix 7 -> 3 fallback, highest-priority branch, AIMD window).
//
// Why a suffix automaton and not an explicit suffix tree: the automaton answers the same questions
// (does the last k tokens' string occur, and which token follows it most often / with most reward)
// with O(n) states and edges, needs no copy of the text, and its suffix links make matching a
// growing context incremental: one transition per accepted token, amortised O(1), never a rescan.
// Every string S that occurs in the history lives in exactly one state; all strings of a state have
// the same set of end positions, so "the subtree of S in a suffix tree" (its occurrences) is a
// property of the state, and so is its priority.  See docs/history-index.md.
//
// Pure C++17, no Python here; bindings.cpp wraps it with pybind11.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace rhymerl {

inline constexpr uint32_t kNone = 0xFFFFFFFFu;
inline constexpr uint32_t kFormatVersion = 1;
inline constexpr std::size_t kHeaderSize = 40;
// Rewards are mapped to integers so that priorities are exact sums (independent of summation
// order): w = 1 + round((r - r_min) / (r_max - r_min) * kRewardScale), or 1 when all are equal.
inline constexpr double kRewardScale = 1048576.0;  // 2^20
// States and edges are addressed with uint32; a SAM has < 2n states and < 3n edges.
inline constexpr uint64_t kMaxTokens = (uint64_t{1} << 30);

// Bad serialised bytes: wrong magic, version, size, checksum or structure (a ValueError in Python).
class FormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// CRC-32 (IEEE 802.3 / zlib polynomial), slicing-by-8; equal to Python's zlib.crc32.
uint32_t crc32(const uint8_t* data, std::size_t size, uint32_t crc = 0);

class SuffixIndex {
 public:
  // tokens: all responses concatenated; offsets: n_responses + 1 entries, offsets[0] == 0,
  // non-decreasing, offsets[n] == total tokens; rewards: one finite value per response.
  // Throws std::invalid_argument on malformed input.
  static std::shared_ptr<SuffixIndex> build(const int32_t* tokens, const int64_t* offsets,
                                            std::size_t n_responses, const double* rewards,
                                            bool reward_weighted);
  // Parses bytes written by serialize_into; validates everything, throws FormatError.
  static std::shared_ptr<SuffixIndex> load(const uint8_t* data, std::size_t size);

  std::size_t serialized_size() const;
  void serialize_into(uint8_t* out) const;

  // Follows one token: (state, len) is the state of the longest suffix (at most prefix_max long) of
  // the fed context that occurs in the history, and its length. Amortised O(1).
  uint32_t advance(uint32_t state, uint32_t& len, int32_t token, uint32_t prefix_max) const {
    for (;;) {
      const uint32_t next = find(state, token);
      if (next != kNone) {
        state = next;
        ++len;
        break;
      }
      if (state == 0) {
        len = 0;
        return 0;
      }
      state = link_[state];
      len = len_[state];
    }
    // Keep only the last prefix_max tokens: len <= prefix_max + 1 here, so this moves at most once.
    if (len > prefix_max) {
      len = prefix_max;
      while (len_[link_[state]] >= len) state = link_[state];
    }
    return state;
  }

  // Writes up to max_tokens draft tokens for a context whose match is (state, len), the longest
  // suffix of the context (at most prefix_max tokens) that occurs in the history: falls back to
  // shorter suffixes while the match has no continuation, gives up below prefix_min, then follows
  // the highest-priority edge from state to state. With min_prob > 0 it also stops before a token
  // whose path probability (product of priority(child) / priority(parent) along the draft) falls
  // below min_prob. Returns the number of tokens written.
  uint32_t draft(uint32_t state, uint32_t len, uint32_t prefix_min, int32_t* out, uint32_t max_tokens,
                 double min_prob = 0.0) const {
    if (max_tokens == 0) return 0;
    while (len >= prefix_min && best_[state] == kNone) {
      if (state == 0) return 0;
      state = link_[state];
      len = len_[state];
    }
    if (len < prefix_min) return 0;
    uint32_t n = 0;
    if (min_prob <= 0.0) {
      while (n < max_tokens) {
        const uint32_t e = best_[state];
        if (e == kNone) break;
        out[n++] = edge_token_[e];
        state = edge_target_[e];
      }
      return n;
    }
    double prob = 1.0;
    while (n < max_tokens) {
      const uint32_t e = best_[state];
      if (e == kNone) break;
      const uint32_t next = edge_target_[e];
      prob *= static_cast<double>(weight_[next]) / static_cast<double>(weight_[state]);
      if (prob < min_prob) break;
      out[n++] = edge_token_[e];
      state = next;
    }
    return n;
  }

  // The fallback of `draft`: moves (state, len) to the longest suffix with a continuation; false
  // (and len = 0) when that is shorter than prefix_min.
  bool match(uint32_t& state, uint32_t& len, uint32_t prefix_min) const {
    while (len >= prefix_min && best_[state] == kNone) {
      if (state == 0) break;
      state = link_[state];
      len = len_[state];
    }
    if (len < prefix_min || best_[state] == kNone) {
      len = 0;
      return false;
    }
    return true;
  }

  // Target of the edge labelled token out of state, or kNone.
  uint32_t find(uint32_t state, int32_t token) const {
    uint32_t lo = edge_begin_[state];
    uint32_t hi = edge_begin_[state + 1];
    while (hi - lo > 8) {  // binary search on the sorted labels of a wide state (e.g. the root)
      const uint32_t mid = lo + (hi - lo) / 2;
      if (edge_token_[mid] <= token) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    for (uint32_t e = lo; e < hi; ++e) {
      if (edge_token_[e] == token) return edge_target_[e];
    }
    return kNone;
  }

  // State of the exact string tokens[0..n) (walking from the root), or kNone if it does not occur.
  uint32_t locate(const int32_t* tokens, std::size_t n) const;

  // RhymeRL §5.1's similarity measure for one response: walk it; wherever its last `prefix` tokens
  // occur in the history, count as accepted the longest continuation that also occurs after them
  // (in any history response), then generate one token. Returns the accepted token count.
  uint64_t oracle_accepted(const int32_t* tokens, std::size_t n, uint32_t prefix) const;

  uint32_t n_states() const { return static_cast<uint32_t>(len_.size()); }
  uint32_t n_edges() const { return static_cast<uint32_t>(edge_token_.size()); }
  uint64_t n_tokens() const { return n_tokens_; }
  uint32_t n_responses() const { return n_responses_; }
  bool reward_weighted() const { return reward_weighted_; }
  uint64_t weight(uint32_t s) const { return weight_[s]; }
  uint32_t count(uint32_t s) const { return count_[s]; }
  uint32_t state_len(uint32_t s) const { return len_[s]; }
  std::size_t memory_bytes() const;

 private:
  SuffixIndex() = default;
  void validate() const;  // structural invariants of loaded data; throws FormatError

  // Per state: priority (quantised reward sum, occurrence count), longest-string length, suffix
  // link, best outgoing edge (kNone: no continuation), first edge in the CSR edge arrays.
  std::vector<uint64_t> weight_;
  std::vector<uint32_t> count_;
  std::vector<uint32_t> len_;
  std::vector<uint32_t> link_;
  std::vector<uint32_t> best_;
  std::vector<uint32_t> edge_begin_;  // n_states + 1
  // Per edge, grouped by source state and sorted by token within a state.
  std::vector<int32_t> edge_token_;
  std::vector<uint32_t> edge_target_;
  uint64_t n_tokens_ = 0;
  uint32_t n_responses_ = 0;
  bool reward_weighted_ = true;
};

// The current step's responses of one prompt's group, indexed as they are generated (Seer's grouped
// speculative decoding): a suffix trie of bounded depth whose node for string S counts S's
// occurrences. Appending a token to a response extends the response's `depth` newest suffixes by
// one node each (created or counted), so an update costs O(depth) hash-table steps per token and
// nothing is ever rebuilt. Each node keeps the child with the most occurrences (ties: smaller token)
// and the number of its occurrences that continue, so drafting follows one array read per token as
// the history index does. Not thread-safe on its own: the Drafter that feeds it holds its mutex.
class GroupIndex {
 public:
  explicit GroupIndex(uint32_t depth);

  uint32_t depth() const { return depth_; }
  // A response's newest suffixes: path[k] is the node of its last k + 1 tokens (k < filled).
  struct Cursor {
    std::vector<uint32_t> path;
    uint32_t filled = 0;
  };
  Cursor cursor() const { return Cursor{std::vector<uint32_t>(depth_, 0), 0}; }
  // Appends one token to the response behind `cursor`.
  void append(Cursor& cursor, int32_t token);
  // Longest k in [prefix_min, min(prefix_max, filled)] whose last-k node has a continuation;
  // 0 when none. *node gets that node.
  uint32_t match(const Cursor& cursor, uint32_t prefix_max, uint32_t prefix_min, uint32_t* node) const;
  // Follows the most frequent continuation from node (see SuffixIndex::draft for min_prob).
  uint32_t draft(uint32_t node, int32_t* out, uint32_t max_tokens, double min_prob) const;

  uint32_t n_nodes() const { return static_cast<uint32_t>(count_.size()); }
  uint64_t n_tokens() const { return n_tokens_; }
  std::size_t memory_bytes() const;
  std::mutex& mutex() const { return mu_; }

 private:
  uint32_t child(uint32_t node, int32_t token);  // counts one more occurrence; creates the child if new
  uint32_t find(uint32_t node, int32_t token) const;
  void grow();

  uint32_t depth_;
  // Per node: occurrences, occurrences that continue (sum over children), best child, incoming token.
  std::vector<uint32_t> count_;
  std::vector<uint32_t> cont_;
  std::vector<uint32_t> best_;
  std::vector<int32_t> token_;
  // (node, token) -> child, open addressing with linear probing, at most half full.
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> vals_;
  std::size_t used_ = 0;
  uint64_t n_tokens_ = 0;
  mutable std::mutex mu_;
};

struct DrafterParams {
  uint32_t prefix_max = 7;
  uint32_t prefix_min = 3;
  uint32_t window_initial = 2;
  uint32_t window_step = 2;
  uint32_t window_max = 32;
  double min_prob = 0.0;  // 0: the paper's rule (draft the whole window along the best branch)
};

// RhymeRL §5.4's AIMD draft window, the one implementation of the rule: after a verified draft of
// `drafted` > 0 tokens, grow by `step` (up to `max`) if all were accepted, else fall back to
// `initial`; a round without a draft leaves the window as it was.
inline uint32_t aimd_next(uint32_t window, uint32_t drafted, uint32_t accepted, uint32_t initial, uint32_t step,
                          uint32_t max) {
  if (drafted == 0) return window;
  return accepted >= drafted ? std::min(window + step, max) : initial;
}

// Batched drafting state for the sequences a rollout worker is generating. Each sequence is bound
// to its prompt's index. All batched calls validate every argument before changing anything and
// are serialised by an internal mutex (they run with the GIL released).
class Drafter {
 public:
  explicit Drafter(const DrafterParams& params);

  const DrafterParams& params() const { return params_; }
  // Registers a sequence drafting from its prompt's history index, its group's index, or both (at
  // least one); context (may be empty) is fed as if accepted, and appended to the group. Returns a
  // handle. A group index is fed only by this drafter's sequences (its mutex serialises them).
  int64_t add(std::shared_ptr<const SuffixIndex> index, std::shared_ptr<GroupIndex> group, const int32_t* context,
              std::size_t n);
  void remove(const int64_t* handles, std::size_t n);
  std::size_t size() const;

  // Appends tokens[offsets[i]..offsets[i+1]) to sequence handles[i]'s context.
  void feed(const int64_t* handles, std::size_t n, const int64_t* offsets, const int32_t* tokens);
  // AIMD update from the accepted prefix length of each sequence's last draft.
  void report(const int64_t* handles, std::size_t n, const int32_t* accepted);
  // Drafts for every sequence into out_offsets (n + 1 entries) and out (the concatenated drafts,
  // room for `capacity` tokens; n * window_max always suffices, less throws before any change).
  // caps (may be null): per-sequence upper bounds (>= 0) on top of the AIMD window, e.g. the
  // tokens left before max_response_length or an adaptive controller's limit.
  // Returns the number of draft tokens written.
  std::size_t draft(const int64_t* handles, std::size_t n, const int32_t* caps, int64_t* out_offsets,
                    int32_t* out, std::size_t capacity);
  // report (if accepted != nullptr), then feed, then draft: one engine iteration in one call.
  std::size_t step(const int64_t* handles, std::size_t n, const int32_t* accepted, const int64_t* offsets,
                   const int32_t* tokens, const int32_t* caps, int64_t* out_offsets, int32_t* out,
                   std::size_t capacity);

  // Per handle: window, match length, drafted total, accepted total, verify rounds reported.
  void inspect(const int64_t* handles, std::size_t n, int64_t* out5) const;

 private:
  struct Seq {
    const SuffixIndex* index = nullptr;
    GroupIndex* group = nullptr;
    GroupIndex::Cursor cursor;
    uint32_t state = 0;
    uint32_t len = 0;
    uint32_t window = 0;
    uint32_t last_draft = 0;
    uint32_t generation = 0;
    bool live = false;
    uint64_t drafted = 0;
    uint64_t accepted = 0;
    uint64_t rounds = 0;
  };

  Seq& seq(int64_t handle);
  const Seq& seq(int64_t handle) const;
  void check_handles(const int64_t* handles, std::size_t n) const;
  void check_accepted(const int64_t* handles, std::size_t n, const int32_t* accepted) const;
  void check_offsets(std::size_t n, const int64_t* offsets) const;
  void feed_locked(const int64_t* handles, std::size_t n, const int64_t* offsets, const int32_t* tokens);
  void report_locked(const int64_t* handles, std::size_t n, const int32_t* accepted);
  void check_capacity(std::size_t n, std::size_t capacity) const;
  void check_caps(std::size_t n, const int32_t* caps) const;
  std::size_t draft_locked(const int64_t* handles, std::size_t n, const int32_t* caps, int64_t* out_offsets,
                           int32_t* out);
  // One sequence's draft: from whichever of its sources matches the longer suffix of its context.
  uint32_t draft_one(const Seq& s, int32_t* out, uint32_t limit);

  DrafterParams params_;
  std::vector<Seq> seqs_;
  std::vector<std::shared_ptr<const SuffixIndex>> owners_;  // keeps each sequence's index alive
  std::vector<std::shared_ptr<GroupIndex>> group_owners_;
  std::vector<uint32_t> free_;
  std::vector<int32_t> scratch_;  // the group's draft while it is compared with the history's
  std::size_t live_ = 0;
  mutable std::mutex mu_;
};

// vLLM-style n-gram proposer over each sequence's own context (baseline for the benchmarks):
// the longest suffix of length in [min_n, max_n] that occurred earlier in the context (most recent
// occurrence wins among the longest), followed by up to windows[i] tokens after that occurrence.
// contexts: row-major [batch, stride]; lengths[i] <= stride.
void ngram_draft(const int32_t* contexts, std::size_t batch, std::size_t stride,
                 const int64_t* lengths, const int32_t* windows, uint32_t min_n, uint32_t max_n,
                 std::vector<int64_t>& offsets, std::vector<int32_t>& out);

}  // namespace rhymerl
