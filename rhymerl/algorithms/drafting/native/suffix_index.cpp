// Build, serialise, load and validate the reward-aware suffix automaton; the batched drafter; the
// n-gram baseline. See suffix_index.hpp for the model and docs/history-index.md for the format.
#include "suffix_index.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the serialised index format is little-endian; add byte swapping for this platform"
#endif

namespace rhymerl {

// ----------------------------------------------------------------------------------------------
// CRC-32, slicing-by-8 (tables generated at first use from the reflected polynomial 0xEDB88320).

namespace {

struct CrcTables {
  uint32_t t[8][256];
  CrcTables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? (0xEDB88320u ^ (c >> 1)) : (c >> 1);
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFFu];
    }
  }
};

const CrcTables& crc_tables() {
  static const CrcTables tables;
  return tables;
}

}  // namespace

uint32_t crc32(const uint8_t* data, std::size_t size, uint32_t crc) {
  const CrcTables& tb = crc_tables();
  uint32_t c = ~crc;
  while (size >= 8) {
    uint32_t lo;
    uint32_t hi;
    std::memcpy(&lo, data, 4);
    std::memcpy(&hi, data + 4, 4);
    lo ^= c;
    c = tb.t[7][lo & 0xFFu] ^ tb.t[6][(lo >> 8) & 0xFFu] ^ tb.t[5][(lo >> 16) & 0xFFu] ^
        tb.t[4][lo >> 24] ^ tb.t[3][hi & 0xFFu] ^ tb.t[2][(hi >> 8) & 0xFFu] ^
        tb.t[1][(hi >> 16) & 0xFFu] ^ tb.t[0][hi >> 24];
    data += 8;
    size -= 8;
  }
  while (size--) c = tb.t[0][(c ^ *data++) & 0xFFu] ^ (c >> 8);
  return ~c;
}

// ----------------------------------------------------------------------------------------------
// Online generalised suffix automaton. Most states have one or two outgoing edges, so each state
// keeps its first two edges inline (one cache line holds two states); further edges go to an
// overflow list per state (to copy them when the state is cloned) and to one open-addressing hash
// table keyed by (state, token) for lookups. Only the root and a few hub states ever overflow.

namespace {

class Builder {
 public:
  struct State {
    uint32_t len;
    uint32_t link;
    uint32_t deg;       // outgoing edges
    uint32_t overflow;  // head of the overflow edge list (edges 3, 4, ...), kNone if none
    int32_t tok[2];
    uint32_t tgt[2];
  };

  explicit Builder(uint64_t n_tokens) {
    // A suffix automaton over n tokens has at most 2n states; reserving only maps address space,
    // pages are touched as states are created.
    states_.reserve(static_cast<std::size_t>(2 * n_tokens + 2));
    occ_weight_.reserve(static_cast<std::size_t>(2 * n_tokens + 2));
    occ_count_.reserve(static_cast<std::size_t>(2 * n_tokens + 2));
    resize_table(1024);
    new_state(0, kNone);  // the root: the empty string
  }

  void add_response(const int32_t* tokens, std::size_t n, uint64_t weight) {
    uint32_t last = 0;
    for (std::size_t i = 0; i < n; ++i) {
      last = extend(last, tokens[i]);
      occ_weight_[last] += weight;  // one end position: the response's prefix tokens[0..i]
      occ_count_[last] += 1;
    }
  }

  std::size_t n_edges() const { return n_edges_; }

  // Calls f(token, target) for every edge of state s.
  template <typename F>
  void for_each_edge(uint32_t s, F&& f) const {
    const State& st = states_[s];
    for (uint32_t i = 0; i < st.deg && i < 2; ++i) f(st.tok[i], st.tgt[i]);
    for (uint32_t e = st.overflow; e != kNone; e = ovf_next_[e]) f(ovf_token_[e], ovf_target_[e]);
  }

  std::vector<State> states_;
  std::vector<uint64_t> occ_weight_;
  std::vector<uint32_t> occ_count_;

 private:
  struct Slot {
    uint64_t key;
    uint32_t edge;
    uint32_t pad;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  static uint64_t key_of(uint32_t state, int32_t token) {
    return (static_cast<uint64_t>(state) << 32) | static_cast<uint32_t>(token);
  }
  std::size_t slot_of(uint64_t key) const {
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);
  }

  void resize_table(std::size_t cap) {
    std::vector<Slot> old;
    old.swap(table_);
    table_.assign(cap, Slot{kEmpty, 0, 0});
    mask_ = cap - 1;
    shift_ = 64;
    for (std::size_t c = cap; c > 1; c >>= 1) --shift_;
    for (const Slot& s : old) {
      if (s.key != kEmpty) place(s.key, s.edge);
    }
  }

  void place(uint64_t key, uint32_t edge) {
    std::size_t i = slot_of(key);
    while (table_[i].key != kEmpty) i = (i + 1) & mask_;
    table_[i].key = key;
    table_[i].edge = edge;
  }

  // Where the target of (state, token) is stored, or nullptr. Valid until the next insertion.
  uint32_t* target_slot(uint32_t state, int32_t token) {
    State& st = states_[state];
    if (st.deg > 0 && st.tok[0] == token) return &st.tgt[0];
    if (st.deg > 1 && st.tok[1] == token) return &st.tgt[1];
    if (st.deg <= 2) return nullptr;
    const uint64_t key = key_of(state, token);
    std::size_t i = slot_of(key);
    for (;;) {
      const Slot& s = table_[i];
      if (s.key == key) return &ovf_target_[s.edge];
      if (s.key == kEmpty) return nullptr;
      i = (i + 1) & mask_;
    }
  }

  uint32_t new_state(uint32_t len, uint32_t link) {
    const auto id = static_cast<uint32_t>(states_.size());
    states_.push_back(State{len, link, 0, kNone, {0, 0}, {0, 0}});
    occ_weight_.push_back(0);
    occ_count_.push_back(0);
    return id;
  }

  void add_edge(uint32_t state, int32_t token, uint32_t target) {
    State& st = states_[state];
    ++n_edges_;
    if (st.deg < 2) {
      st.tok[st.deg] = token;
      st.tgt[st.deg] = target;
      ++st.deg;
      return;
    }
    const auto e = static_cast<uint32_t>(ovf_token_.size());
    ovf_token_.push_back(token);
    ovf_target_.push_back(target);
    ovf_next_.push_back(st.overflow);
    st.overflow = e;
    ++st.deg;
    if ((ovf_token_.size() + 1) * 2 > table_.size()) resize_table(table_.size() * 2);
    place(key_of(state, token), e);
  }

  uint32_t clone_of(uint32_t q, uint32_t len) {
    const uint32_t c = new_state(len, states_[q].link);
    for_each_edge(q, [&](int32_t token, uint32_t target) { add_edge(c, token, target); });
    states_[q].link = c;
    return c;
  }

  // Redirects p's token-edge and its suffix-link ancestors' from q to clone while they point at q.
  void redirect(uint32_t p, int32_t token, uint32_t q, uint32_t clone) {
    while (p != kNone) {
      uint32_t* t = target_slot(p, token);
      if (t == nullptr || *t != q) break;
      *t = clone;
      p = states_[p].link;
    }
  }

  uint32_t extend(uint32_t last, int32_t token) {
    const uint32_t last_len = states_[last].len;
    if (const uint32_t* t = target_slot(last, token)) {  // the prefix already occurs (another response)
      const uint32_t q = *t;
      if (states_[q].len == last_len + 1) return q;
      const uint32_t clone = clone_of(q, last_len + 1);
      redirect(last, token, q, clone);
      return clone;
    }
    const uint32_t cur = new_state(last_len + 1, 0);
    uint32_t p = last;
    uint32_t q = kNone;
    while (p != kNone) {
      if (const uint32_t* t = target_slot(p, token)) {
        q = *t;
        break;
      }
      add_edge(p, token, cur);
      p = states_[p].link;
    }
    if (p == kNone) return cur;  // link stays the root
    if (states_[p].len + 1 == states_[q].len) {
      states_[cur].link = q;
      return cur;
    }
    const uint32_t clone = clone_of(q, states_[p].len + 1);
    redirect(p, token, q, clone);
    states_[cur].link = clone;
    return cur;
  }

  std::vector<int32_t> ovf_token_;
  std::vector<uint32_t> ovf_target_;
  std::vector<uint32_t> ovf_next_;
  std::vector<Slot> table_;
  std::size_t mask_ = 0;
  int shift_ = 64;
  std::size_t n_edges_ = 0;
};

bool better(uint64_t wa, uint32_t ca, int32_t ta, uint64_t wb, uint32_t cb, int32_t tb) {
  if (wa != wb) return wa > wb;
  if (ca != cb) return ca > cb;
  return ta < tb;
}

}  // namespace

std::shared_ptr<SuffixIndex> SuffixIndex::build(const int32_t* tokens, const int64_t* offsets,
                                                std::size_t n_responses, const double* rewards,
                                                bool reward_weighted) {
  if (n_responses >= kNone) throw std::invalid_argument("too many responses");
  if (n_responses > 0 && offsets[0] != 0) throw std::invalid_argument("offsets[0] must be 0");
  for (std::size_t r = 0; r < n_responses; ++r) {
    if (offsets[r + 1] < offsets[r]) {
      throw std::invalid_argument("offsets must be non-decreasing (response " + std::to_string(r) + ")");
    }
    if (!std::isfinite(rewards[r])) {
      throw std::invalid_argument("reward of response " + std::to_string(r) + " is not finite");
    }
  }
  const uint64_t total = n_responses ? static_cast<uint64_t>(offsets[n_responses]) : 0;
  if (total >= kMaxTokens) {
    throw std::invalid_argument("history too large: " + std::to_string(total) + " tokens (limit " +
                                std::to_string(kMaxTokens - 1) + ")");
  }

  // Reward -> integer weight (see kRewardScale). Frequency-only ranking: every occurrence weighs 1.
  std::vector<uint64_t> weights(n_responses, 1);
  if (reward_weighted && n_responses > 0) {
    const double lo = *std::min_element(rewards, rewards + n_responses);
    const double hi = *std::max_element(rewards, rewards + n_responses);
    if (hi > lo) {
      for (std::size_t r = 0; r < n_responses; ++r) {
        weights[r] = 1 + static_cast<uint64_t>(std::floor((rewards[r] - lo) / (hi - lo) * kRewardScale + 0.5));
      }
    }
  }

  Builder b(total);
  for (std::size_t r = 0; r < n_responses; ++r) {
    b.add_response(tokens + offsets[r], static_cast<std::size_t>(offsets[r + 1] - offsets[r]), weights[r]);
  }

  std::shared_ptr<SuffixIndex> idx(new SuffixIndex());
  idx->n_tokens_ = total;
  idx->n_responses_ = static_cast<uint32_t>(n_responses);
  idx->reward_weighted_ = reward_weighted;
  const std::size_t S = b.states_.size();
  const std::size_t E = b.n_edges();

  // Renumber states by increasing length (counting sort; the root, length 0, stays 0). Then every
  // suffix link points to a smaller id and every edge to a larger one, which (a) lets priorities be
  // summed in one backward pass, (b) makes loading validate termination with sequential checks
  // only, and (c) keeps a draft's successive states close together in memory.
  uint32_t max_len = 0;
  for (const auto& st : b.states_) max_len = std::max(max_len, st.len);
  std::vector<uint32_t> order(S);
  std::vector<uint32_t> rank(S);
  {
    std::vector<uint32_t> bucket(static_cast<std::size_t>(max_len) + 2, 0);
    for (const auto& st : b.states_) ++bucket[st.len + 1];
    for (std::size_t i = 1; i < bucket.size(); ++i) bucket[i] += bucket[i - 1];
    for (uint32_t s = 0; s < S; ++s) {
      const uint32_t r = bucket[b.states_[s].len]++;
      order[r] = s;
      rank[s] = r;
    }
  }
  idx->len_.resize(S);
  idx->link_.resize(S);
  idx->weight_.resize(S);
  idx->count_.resize(S);
  for (uint32_t r = 0; r < S; ++r) {
    const uint32_t s = order[r];
    idx->len_[r] = b.states_[s].len;
    idx->link_[r] = r == 0 ? kNone : rank[b.states_[s].link];
    idx->weight_[r] = b.occ_weight_[s];
    idx->count_[r] = b.occ_count_[s];
  }
  std::vector<uint64_t>().swap(b.occ_weight_);
  std::vector<uint32_t>().swap(b.occ_count_);

  // Priorities: a state's end positions are its own plus those of the states linking to it.
  {
    uint64_t* w = idx->weight_.data();
    uint32_t* c = idx->count_.data();
    const uint32_t* link = idx->link_.data();
    for (std::size_t r = S; r-- > 1;) {
      w[link[r]] += w[r];
      c[link[r]] += c[r];
    }
  }

  // Edges into CSR form, sorted by token within a state; best edge by (weight, count, -token).
  idx->edge_begin_.resize(S + 1);
  idx->edge_token_.resize(E);
  idx->edge_target_.resize(E);
  idx->best_.resize(S);
  int32_t* tok = idx->edge_token_.data();
  uint32_t* tgt = idx->edge_target_.data();
  const uint64_t* w = idx->weight_.data();
  const uint32_t* c = idx->count_.data();
  std::vector<std::pair<int32_t, uint32_t>> wide;
  uint32_t k = 0;
  for (uint32_t r = 0; r < S; ++r) {
    const uint32_t begin = k;
    idx->edge_begin_[r] = begin;
    b.for_each_edge(order[r], [&](int32_t token, uint32_t target) {
      tok[k] = token;
      tgt[k] = rank[target];
      ++k;
    });
    const uint32_t end = k;
    if (end - begin > 16) {
      wide.clear();
      for (uint32_t i = begin; i < end; ++i) wide.emplace_back(tok[i], tgt[i]);
      std::sort(wide.begin(), wide.end());
      for (uint32_t i = begin; i < end; ++i) {
        tok[i] = wide[i - begin].first;
        tgt[i] = wide[i - begin].second;
      }
    } else {
      for (uint32_t i = begin + 1; i < end; ++i) {  // insertion sort: most states have 1-2 edges
        const int32_t t = tok[i];
        const uint32_t g = tgt[i];
        uint32_t j = i;
        while (j > begin && tok[j - 1] > t) {
          tok[j] = tok[j - 1];
          tgt[j] = tgt[j - 1];
          --j;
        }
        tok[j] = t;
        tgt[j] = g;
      }
    }
    uint32_t best = kNone;
    for (uint32_t i = begin; i < end; ++i) {
      if (best == kNone || better(w[tgt[i]], c[tgt[i]], tok[i], w[tgt[best]], c[tgt[best]], tok[best])) best = i;
    }
    idx->best_[r] = best;
  }
  idx->edge_begin_[S] = k;
  return idx;
}

uint32_t SuffixIndex::locate(const int32_t* tokens, std::size_t n) const {
  uint32_t s = 0;
  for (std::size_t i = 0; i < n && s != kNone; ++i) s = find(s, tokens[i]);
  return s;
}

uint64_t SuffixIndex::oracle_accepted(const int32_t* tokens, std::size_t n, uint32_t prefix) const {
  uint64_t accepted = 0;
  std::size_t pos = 0;
  while (pos < n) {
    if (pos >= prefix) {
      uint32_t s = locate(tokens + pos - prefix, prefix);
      if (s != kNone) {
        while (pos < n) {
          const uint32_t t = find(s, tokens[pos]);
          if (t == kNone) break;
          s = t;
          ++pos;
          ++accepted;
        }
      }
    }
    ++pos;  // the token the model generates itself
  }
  return accepted;
}

std::size_t SuffixIndex::memory_bytes() const {
  return weight_.capacity() * sizeof(uint64_t) +
         (count_.capacity() + len_.capacity() + link_.capacity() + best_.capacity() + edge_begin_.capacity() +
          edge_target_.capacity()) *
             sizeof(uint32_t) +
         edge_token_.capacity() * sizeof(int32_t) + sizeof(SuffixIndex);
}

// ----------------------------------------------------------------------------------------------
// Serialisation (format version 1, little-endian):
//   0  char[8] magic "RHYMEIDX"     8  u32 version        12 u32 flags (bit 0: reward_weighted)
//   16 u64 n_tokens                 24 u32 n_responses    28 u32 n_states (S)
//   32 u32 n_edges (E)              36 u32 crc32 of bytes [0, 36) and [40, end)
//   40 u64 weight[S] | u32 count[S] | u32 len[S] | u32 link[S] | u32 best[S] | u32 edge_begin[S+1]
//      | i32 edge_token[E] | u32 edge_target[E]

namespace {

constexpr char kMagic[8] = {'R', 'H', 'Y', 'M', 'E', 'I', 'D', 'X'};

uint64_t payload_size(uint64_t S, uint64_t E) { return 28 * S + 4 + 8 * E; }

template <typename T>
uint8_t* put(uint8_t* out, const std::vector<T>& v) {
  if (!v.empty()) std::memcpy(out, v.data(), v.size() * sizeof(T));
  return out + v.size() * sizeof(T);
}

template <typename T>
const uint8_t* take(const uint8_t* in, std::vector<T>& v, std::size_t n) {
  v.resize(n);
  if (n) std::memcpy(v.data(), in, n * sizeof(T));
  return in + n * sizeof(T);
}

template <typename T>
T read_at(const uint8_t* data, std::size_t offset) {
  T v;
  std::memcpy(&v, data + offset, sizeof(T));
  return v;
}

template <typename T>
void write_at(uint8_t* data, std::size_t offset, T v) {
  std::memcpy(data + offset, &v, sizeof(T));
}

[[noreturn]] void corrupt(const std::string& what) { throw FormatError("corrupt history index: " + what); }

}  // namespace

std::size_t SuffixIndex::serialized_size() const {
  return kHeaderSize + static_cast<std::size_t>(payload_size(n_states(), n_edges()));
}

void SuffixIndex::serialize_into(uint8_t* out) const {
  std::memcpy(out, kMagic, 8);
  write_at<uint32_t>(out, 8, kFormatVersion);
  write_at<uint32_t>(out, 12, reward_weighted_ ? 1u : 0u);
  write_at<uint64_t>(out, 16, n_tokens_);
  write_at<uint32_t>(out, 24, n_responses_);
  write_at<uint32_t>(out, 28, n_states());
  write_at<uint32_t>(out, 32, n_edges());
  uint8_t* p = out + kHeaderSize;
  p = put(p, weight_);
  p = put(p, count_);
  p = put(p, len_);
  p = put(p, link_);
  p = put(p, best_);
  p = put(p, edge_begin_);
  p = put(p, edge_token_);
  p = put(p, edge_target_);
  uint32_t crc = crc32(out, 36);
  crc = crc32(out + kHeaderSize, static_cast<std::size_t>(p - out) - kHeaderSize, crc);
  write_at<uint32_t>(out, 36, crc);
}

std::shared_ptr<SuffixIndex> SuffixIndex::load(const uint8_t* data, std::size_t size) {
  if (size < kHeaderSize) {
    throw FormatError("truncated history index: " + std::to_string(size) + " bytes, the header alone is " +
                      std::to_string(kHeaderSize));
  }
  if (std::memcmp(data, kMagic, 8) != 0) throw FormatError("not a history index (bad magic)");
  const auto version = read_at<uint32_t>(data, 8);
  if (version != kFormatVersion) {
    throw FormatError("unsupported history index version " + std::to_string(version) + " (this build reads " +
                      std::to_string(kFormatVersion) + ")");
  }
  const auto flags = read_at<uint32_t>(data, 12);
  const auto S = read_at<uint32_t>(data, 28);
  const auto E = read_at<uint32_t>(data, 32);
  const uint64_t expected = kHeaderSize + payload_size(S, E);
  if (size < expected) {
    throw FormatError("truncated history index: " + std::to_string(size) + " bytes, header announces " +
                      std::to_string(expected));
  }
  if (size > expected) {
    throw FormatError("history index has " + std::to_string(size - expected) + " trailing bytes");
  }
  uint32_t crc = crc32(data, 36);
  crc = crc32(data + kHeaderSize, size - kHeaderSize, crc);
  if (crc != read_at<uint32_t>(data, 36)) throw FormatError("history index checksum mismatch (corrupted bytes)");
  if (flags > 1u) corrupt("unknown flags " + std::to_string(flags));
  if (S == 0) corrupt("no root state");

  std::shared_ptr<SuffixIndex> idx(new SuffixIndex());
  idx->reward_weighted_ = (flags & 1u) != 0;
  idx->n_tokens_ = read_at<uint64_t>(data, 16);
  idx->n_responses_ = read_at<uint32_t>(data, 24);
  const uint8_t* p = data + kHeaderSize;
  p = take(p, idx->weight_, S);
  p = take(p, idx->count_, S);
  p = take(p, idx->len_, S);
  p = take(p, idx->link_, S);
  p = take(p, idx->best_, S);
  p = take(p, idx->edge_begin_, static_cast<std::size_t>(S) + 1);
  p = take(p, idx->edge_token_, E);
  take(p, idx->edge_target_, E);
  idx->validate();
  return idx;
}

// Everything the hot paths rely on to stay in bounds and terminate, so that even bytes with a
// valid checksum (a bug, or a crafted file) cannot crash or hang the process. States are numbered
// by length, so "links point down, edges point up" is checked with sequential passes only; it
// makes every suffix-link walk end at the root and every draft walk finite.
void SuffixIndex::validate() const {
  const uint32_t S = n_states();
  const uint32_t E = n_edges();
  if (len_[0] != 0 || link_[0] != kNone) corrupt("bad root state");
  for (uint32_t s = 1; s < S; ++s) {
    if (link_[s] >= s) corrupt("bad suffix link of state " + std::to_string(s));
    if (len_[s] < len_[s - 1]) corrupt("states not ordered by length at state " + std::to_string(s));
  }
  if (edge_begin_[0] != 0 || edge_begin_[S] != E) corrupt("bad edge table bounds");
  for (uint32_t s = 0; s < S; ++s) {
    const uint32_t begin = edge_begin_[s];
    const uint32_t end = edge_begin_[s + 1];
    if (end < begin || end > E) corrupt("bad edge range of state " + std::to_string(s));
    for (uint32_t i = begin; i < end; ++i) {
      if (edge_target_[i] <= s || edge_target_[i] >= S) corrupt("bad edge target in state " + std::to_string(s));
      if (i > begin && edge_token_[i - 1] >= edge_token_[i]) corrupt("unsorted edges in state " + std::to_string(s));
    }
    if (begin == end ? best_[s] != kNone : (best_[s] < begin || best_[s] >= end)) {
      corrupt("bad best edge of state " + std::to_string(s));
    }
  }
}

// ----------------------------------------------------------------------------------------------
// Drafter

// ----------------------------------------------------------------------------------------------
// Group index: a bounded-depth suffix trie with counts, updated token by token.

GroupIndex::GroupIndex(uint32_t depth) : depth_(depth) {
  if (depth < 2) throw std::invalid_argument("group depth must be >= 2");
  count_.push_back(0);
  cont_.push_back(0);
  best_.push_back(kNone);
  token_.push_back(0);
  keys_.assign(1024, ~uint64_t{0});
  vals_.assign(1024, 0);
}

namespace {
inline uint64_t edge_key(uint32_t node, int32_t token) {
  return (static_cast<uint64_t>(node) << 32) | static_cast<uint32_t>(token);
}
inline std::size_t edge_slot(uint64_t key, std::size_t mask) {  // murmur3's finaliser: every key bit moves the slot
  key ^= key >> 33;
  key *= 0xff51afd7ed558ccdull;
  key ^= key >> 33;
  key *= 0xc4ceb9fe1a85ec53ull;
  key ^= key >> 33;
  return static_cast<std::size_t>(key) & mask;
}
}  // namespace

uint32_t GroupIndex::find(uint32_t node, int32_t token) const {
  const uint64_t key = edge_key(node, token);
  const std::size_t mask = keys_.size() - 1;
  for (std::size_t i = edge_slot(key, mask);; i = (i + 1) & mask) {
    if (keys_[i] == key) return vals_[i];
    if (keys_[i] == ~uint64_t{0}) return kNone;
  }
}

void GroupIndex::grow() {
  std::vector<uint64_t> keys(keys_.size() * 2, ~uint64_t{0});
  std::vector<uint32_t> vals(keys.size(), 0);
  const std::size_t mask = keys.size() - 1;
  for (std::size_t j = 0; j < keys_.size(); ++j) {
    if (keys_[j] == ~uint64_t{0}) continue;
    std::size_t i = edge_slot(keys_[j], mask);
    while (keys[i] != ~uint64_t{0}) i = (i + 1) & mask;
    keys[i] = keys_[j];
    vals[i] = vals_[j];
  }
  keys_.swap(keys);
  vals_.swap(vals);
}

uint32_t GroupIndex::child(uint32_t node, int32_t token) {
  const uint64_t key = edge_key(node, token);
  std::size_t mask = keys_.size() - 1;
  std::size_t i = edge_slot(key, mask);
  while (keys_[i] != key && keys_[i] != ~uint64_t{0}) i = (i + 1) & mask;
  uint32_t c;
  if (keys_[i] == key) {
    c = vals_[i];
  } else {
    if (count_.size() >= 0x7FFFFFFFu) throw std::length_error("group index: too many nodes");
    c = static_cast<uint32_t>(count_.size());
    count_.push_back(0);
    cont_.push_back(0);
    best_.push_back(kNone);
    token_.push_back(token);
    keys_[i] = key;
    vals_[i] = c;
    if (++used_ * 2 >= keys_.size()) grow();
  }
  ++count_[c];
  ++cont_[node];
  const uint32_t b = best_[node];
  if (b == kNone || (c != b && (count_[c] > count_[b] || (count_[c] == count_[b] && token_[c] < token_[b])))) {
    best_[node] = c;
  }
  return c;
}

void GroupIndex::append(Cursor& cursor, int32_t token) {
  uint32_t* path = cursor.path.data();
  for (uint32_t k = std::min(cursor.filled, depth_ - 1); k >= 1; --k) path[k] = child(path[k - 1], token);
  path[0] = child(0, token);
  cursor.filled = std::min(cursor.filled + 1, depth_);
  ++n_tokens_;
}

uint32_t GroupIndex::match(const Cursor& cursor, uint32_t prefix_max, uint32_t prefix_min, uint32_t* node) const {
  for (uint32_t k = std::min(prefix_max, cursor.filled); k >= prefix_min && k >= 1; --k) {
    if (best_[cursor.path[k - 1]] != kNone) {
      *node = cursor.path[k - 1];
      return k;
    }
  }
  return 0;
}

uint32_t GroupIndex::draft(uint32_t node, int32_t* out, uint32_t max_tokens, double min_prob) const {
  uint32_t n = 0;
  double prob = 1.0;
  while (n < max_tokens) {
    const uint32_t b = best_[node];
    if (b == kNone) break;
    if (min_prob > 0.0) {
      prob *= static_cast<double>(count_[b]) / static_cast<double>(cont_[node]);
      if (prob < min_prob) break;
    }
    out[n++] = token_[b];
    node = b;
  }
  return n;
}

std::size_t GroupIndex::memory_bytes() const {
  return count_.capacity() * 4 + cont_.capacity() * 4 + best_.capacity() * 4 + token_.capacity() * 4 +
         keys_.capacity() * 8 + vals_.capacity() * 4;
}

// ----------------------------------------------------------------------------------------------
// Drafter

Drafter::Drafter(const DrafterParams& params) : params_(params) {
  if (params.prefix_min < 1) throw std::invalid_argument("prefix_min must be >= 1");
  if (params.prefix_max < params.prefix_min) throw std::invalid_argument("prefix_max must be >= prefix_min");
  if (params.window_initial < 1) throw std::invalid_argument("window_initial must be >= 1");
  if (params.window_max < params.window_initial) {
    throw std::invalid_argument("window_max must be >= window_initial");
  }
  if (params.window_max > (1u << 20)) throw std::invalid_argument("window_max must be <= 2^20");
  if (!(params.min_prob >= 0.0 && params.min_prob <= 1.0)) throw std::invalid_argument("min_prob must be in [0, 1]");
}

Drafter::Seq& Drafter::seq(int64_t handle) { return seqs_[static_cast<std::size_t>(handle & 0xFFFFFFFF)]; }
const Drafter::Seq& Drafter::seq(int64_t handle) const {
  return seqs_[static_cast<std::size_t>(handle & 0xFFFFFFFF)];
}

void Drafter::check_handles(const int64_t* handles, std::size_t n) const {
  for (std::size_t i = 0; i < n; ++i) {
    const int64_t h = handles[i];
    const auto slot = static_cast<uint64_t>(h) & 0xFFFFFFFFu;
    const auto gen = static_cast<uint64_t>(h) >> 32;
    if (h <= 0 || slot >= seqs_.size() || !seqs_[slot].live || seqs_[slot].generation != gen) {
      throw std::invalid_argument("unknown or removed sequence handle " + std::to_string(h) + " at position " +
                                  std::to_string(i));
    }
  }
}

void Drafter::check_offsets(std::size_t n, const int64_t* offsets) const {
  if (offsets[0] != 0) throw std::invalid_argument("offsets[0] must be 0");
  for (std::size_t i = 0; i < n; ++i) {
    if (offsets[i + 1] < offsets[i]) {
      throw std::invalid_argument("offsets must be non-decreasing (position " + std::to_string(i) + ")");
    }
  }
}

void Drafter::check_accepted(const int64_t* handles, std::size_t n, const int32_t* accepted) const {
  for (std::size_t i = 0; i < n; ++i) {
    const Seq& s = seq(handles[i]);
    if (accepted[i] < 0 || static_cast<uint32_t>(accepted[i]) > s.last_draft) {
      throw std::invalid_argument("accepted[" + std::to_string(i) + "] = " + std::to_string(accepted[i]) +
                                  " is outside [0, " + std::to_string(s.last_draft) + "], the last draft's length");
    }
  }
}

int64_t Drafter::add(std::shared_ptr<const SuffixIndex> index, std::shared_ptr<GroupIndex> group,
                     const int32_t* context, std::size_t n) {
  if (!index && !group) throw std::invalid_argument("a sequence needs a history index, a group index or both");
  std::lock_guard<std::mutex> lock(mu_);
  uint32_t slot;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else {
    if (seqs_.size() >= 0x7FFFFFFFu) throw std::length_error("too many sequences");
    slot = static_cast<uint32_t>(seqs_.size());
    seqs_.emplace_back();
    owners_.emplace_back();
    group_owners_.emplace_back();
  }
  Seq& s = seqs_[slot];
  const uint32_t generation = s.generation + 1 == 0 ? 1 : s.generation + 1;  // handles stay > 0
  s = Seq();
  s.generation = generation;
  s.live = true;
  s.index = index.get();
  s.group = group.get();
  s.window = params_.window_initial;
  owners_[slot] = std::move(index);
  group_owners_[slot] = std::move(group);
  if (s.index != nullptr) {
    for (std::size_t i = 0; i < n; ++i) s.state = s.index->advance(s.state, s.len, context[i], params_.prefix_max);
  }
  if (s.group != nullptr) {
    s.cursor = s.group->cursor();
    std::lock_guard<std::mutex> group_lock(s.group->mutex());
    for (std::size_t i = 0; i < n; ++i) s.group->append(s.cursor, context[i]);
  }
  ++live_;
  return static_cast<int64_t>((static_cast<uint64_t>(generation) << 32) | slot);
}

void Drafter::remove(const int64_t* handles, std::size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  check_handles(handles, n);
  std::vector<int64_t> sorted(handles, handles + n);
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    throw std::invalid_argument("a sequence handle is listed twice in remove()");
  }
  for (std::size_t i = 0; i < n; ++i) {
    const auto slot = static_cast<uint32_t>(handles[i] & 0xFFFFFFFF);
    Seq& s = seqs_[slot];
    s.live = false;
    s.index = nullptr;
    s.group = nullptr;
    s.cursor = GroupIndex::Cursor();
    owners_[slot].reset();
    group_owners_[slot].reset();
    free_.push_back(slot);
    --live_;
  }
}

std::size_t Drafter::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_;
}

void Drafter::feed_locked(const int64_t* handles, std::size_t n, const int64_t* offsets, const int32_t* tokens) {
  const uint32_t pmax = params_.prefix_max;
  for (std::size_t i = 0; i < n; ++i) {
    Seq& s = seq(handles[i]);
    if (s.index != nullptr) {
      const SuffixIndex& idx = *s.index;
      uint32_t state = s.state;
      uint32_t len = s.len;
      for (int64_t k = offsets[i]; k < offsets[i + 1]; ++k) state = idx.advance(state, len, tokens[k], pmax);
      s.state = state;
      s.len = len;
    }
    if (s.group != nullptr && offsets[i + 1] > offsets[i]) {
      std::lock_guard<std::mutex> group_lock(s.group->mutex());
      for (int64_t k = offsets[i]; k < offsets[i + 1]; ++k) s.group->append(s.cursor, tokens[k]);
    }
  }
}

void Drafter::report_locked(const int64_t* handles, std::size_t n, const int32_t* accepted) {
  for (std::size_t i = 0; i < n; ++i) {
    Seq& s = seq(handles[i]);
    const auto a = static_cast<uint32_t>(accepted[i]);
    s.window = aimd_next(s.window, s.last_draft, a, params_.window_initial, params_.window_step, params_.window_max);
    s.accepted += a;
    s.rounds += 1;
    s.last_draft = 0;
  }
}

void Drafter::check_capacity(std::size_t n, std::size_t capacity) const {
  if (capacity < n * static_cast<std::size_t>(params_.window_max)) {
    throw std::invalid_argument("draft output has room for " + std::to_string(capacity) + " tokens; " +
                                std::to_string(n) + " sequences need len(handles) * window_max = " +
                                std::to_string(n * params_.window_max));
  }
}

void Drafter::check_caps(std::size_t n, const int32_t* caps) const {
  if (caps == nullptr) return;
  for (std::size_t i = 0; i < n; ++i) {
    if (caps[i] < 0) throw std::invalid_argument("max_tokens[" + std::to_string(i) + "] is negative");
  }
}

std::size_t Drafter::draft_locked(const int64_t* handles, std::size_t n, const int32_t* caps, int64_t* out_offsets,
                                  int32_t* out) {
  std::size_t pos = 0;
  out_offsets[0] = 0;
  for (std::size_t i = 0; i < n; ++i) {
    Seq& s = seq(handles[i]);
    const uint32_t limit = caps ? std::min(s.window, static_cast<uint32_t>(caps[i])) : s.window;
    const uint32_t k = limit == 0 ? 0 : draft_one(s, out + pos, limit);
    s.last_draft = k;
    s.drafted += k;
    pos += k;
    out_offsets[i + 1] = static_cast<int64_t>(pos);
  }
  return pos;
}

uint32_t Drafter::draft_one(const Seq& s, int32_t* out, uint32_t limit) {
  const uint32_t pmin = params_.prefix_min;
  uint32_t state = s.state;
  uint32_t hlen = s.len;
  if (s.index == nullptr || !s.index->match(state, hlen, pmin)) hlen = 0;
  if (s.group == nullptr) return hlen == 0 ? 0 : s.index->draft(state, hlen, pmin, out, limit, params_.min_prob);
  std::lock_guard<std::mutex> group_lock(s.group->mutex());
  uint32_t node = 0;
  const uint32_t glen = s.group->match(s.cursor, params_.prefix_max, pmin, &node);
  if (glen == 0 && hlen == 0) return 0;
  if (glen > hlen) return s.group->draft(node, out, limit, params_.min_prob);
  const uint32_t k = s.index->draft(state, hlen, pmin, out, limit, params_.min_prob);
  if (glen < hlen || k == limit) return k;
  // equally long matches: the longer draft (history's on a tie)
  scratch_.resize(limit);
  const uint32_t g = s.group->draft(node, scratch_.data(), limit, params_.min_prob);
  if (g <= k) return k;
  std::copy(scratch_.begin(), scratch_.begin() + g, out);
  return g;
}

void Drafter::feed(const int64_t* handles, std::size_t n, const int64_t* offsets, const int32_t* tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  check_handles(handles, n);
  check_offsets(n, offsets);
  feed_locked(handles, n, offsets, tokens);
}

void Drafter::report(const int64_t* handles, std::size_t n, const int32_t* accepted) {
  std::lock_guard<std::mutex> lock(mu_);
  check_handles(handles, n);
  check_accepted(handles, n, accepted);
  report_locked(handles, n, accepted);
}

std::size_t Drafter::draft(const int64_t* handles, std::size_t n, const int32_t* caps, int64_t* out_offsets,
                           int32_t* out, std::size_t capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  check_handles(handles, n);
  check_capacity(n, capacity);
  check_caps(n, caps);
  return draft_locked(handles, n, caps, out_offsets, out);
}

std::size_t Drafter::step(const int64_t* handles, std::size_t n, const int32_t* accepted, const int64_t* offsets,
                          const int32_t* tokens, const int32_t* caps, int64_t* out_offsets, int32_t* out,
                          std::size_t capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  check_handles(handles, n);
  check_offsets(n, offsets);
  check_capacity(n, capacity);
  check_caps(n, caps);
  if (accepted != nullptr) {
    check_accepted(handles, n, accepted);
    report_locked(handles, n, accepted);
  }
  feed_locked(handles, n, offsets, tokens);
  return draft_locked(handles, n, caps, out_offsets, out);
}

void Drafter::inspect(const int64_t* handles, std::size_t n, int64_t* out5) const {
  std::lock_guard<std::mutex> lock(mu_);
  check_handles(handles, n);
  for (std::size_t i = 0; i < n; ++i) {
    const Seq& s = seq(handles[i]);
    out5[5 * i + 0] = s.window;
    out5[5 * i + 1] = s.len;
    out5[5 * i + 2] = static_cast<int64_t>(s.drafted);
    out5[5 * i + 3] = static_cast<int64_t>(s.accepted);
    out5[5 * i + 4] = static_cast<int64_t>(s.rounds);
  }
}

// ----------------------------------------------------------------------------------------------
// n-gram baseline: scan the context backwards for earlier occurrences of its last token and extend
// each match backwards; a full max_n match ends the scan (it is the most recent longest one).

void ngram_draft(const int32_t* contexts, std::size_t batch, std::size_t stride, const int64_t* lengths,
                 const int32_t* windows, uint32_t min_n, uint32_t max_n, std::vector<int64_t>& offsets,
                 std::vector<int32_t>& out) {
  offsets.resize(batch + 1);
  offsets[0] = 0;
  out.clear();
  for (std::size_t b = 0; b < batch; ++b) {
    const int32_t* ctx = contexts + b * stride;
    const auto n = static_cast<std::size_t>(lengths[b]);
    std::size_t best_len = 0;
    std::size_t best_end = 0;
    if (n >= 2 && windows[b] > 0) {
      const int32_t last = ctx[n - 1];
      for (std::size_t j = n - 1; j-- > 0;) {
        if (ctx[j] != last) continue;
        std::size_t m = 1;
        while (m < max_n && m <= j && ctx[j - m] == ctx[n - 1 - m]) ++m;
        if (m > best_len) {
          best_len = m;
          best_end = j;
          if (m >= max_n) break;
        }
      }
    }
    if (best_len >= min_n) {
      const std::size_t stop = std::min(n, best_end + 1 + static_cast<std::size_t>(windows[b]));
      out.insert(out.end(), ctx + best_end + 1, ctx + stop);
    }
    offsets[b + 1] = static_cast<int64_t>(out.size());
  }
}

}  // namespace rhymerl
