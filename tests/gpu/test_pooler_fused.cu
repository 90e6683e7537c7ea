// The fused gather + pre_expert_norm + NVFP4 consumer against the stock path
// (the gathered rows -> ExpertNorm -> nvfp4_quantize) on the same projected
// blocks, bit for bit, over 102,400 random rows of several distributions and
// global scales, at tp 1 (one GPU), tp 2 (two GPUs) and tp 4 (four ranks on
// two GPUs); and the BF16 edge consumer (plain gather, then ExpertNorm)
// against the stock gather + norm, equal except the sign of zero. And the
// pooler GEMM's fused publish (what Pooler::run launches) against its plain
// run followed by the mailbox's own publish, byte for byte.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <vector>
#include <string>
#include <random>
#include <optional>
#include <algorithm>
#include <cstring>

#include "pooler_test_util.h"
#include "spark_decode/expert_norm.h"
#include "spark_decode/mailbox.h"
#include "spark_decode/model_shape.h"
#include "spark_decode/nvfp4.h"
#include "spark_decode/pooler.h"
#include "spark_decode/pooler_gemm.h"

namespace sd = spark_decode;
using namespace sd::testing;
using namespace sd::testing::pooler_tests;

namespace {

constexpr int kChunkRows = 12800;
// Global scales: typical (448 * 6 / amax), 1, tiny and huge.
constexpr float kScales[] = {2688.0f / 11.0f, 1.0f, 0x1p-24f, 0x1p30f, 0.013f, 57.0f, 0x1p-3f, 4096.0f};

// Rows [0, rows) of every source: columns [q width, (q + 1) width).
std::vector<uint16_t> block_of(const std::vector<uint16_t>& full, int rows, int cols, int q, int width) {
  std::vector<uint16_t> b(size_t(rows) * width);
  for (int r = 0; r < rows; ++r)
    std::memcpy(b.data() + size_t(r) * width, full.data() + size_t(r) * cols + size_t(q) * width, width * 2);
  return b;
}

// The consumer calls of one chunk: b drawn from `seed` (the same on every
// rank), rows consumed in order; fn(offset, b) per call.
template <typename Fn>
void for_each_call(int rows, uint64_t seed, Fn fn) {
  std::mt19937_64 g(seed);
  for (int off = 0; off < rows;) {
    const int b = std::min<int>(1 + int(g() % sd::kMaxBatch), rows - off);
    fn(off, b);
    off += b;
  }
}

void fused_equals_stock(sd::Group& group, int device, int chunks, uint64_t seed) {
  const int tp = group.size(), rank = group.rank(), cols = sd::kMuseSpark.pooled, width = cols / tp;
  const int R = kChunkRows;
  sd::LamportMailbox::Options mo;
  mo.guard_bytes = 4096;
  sd::LamportMailbox mb(group, tp, rank, sd::kMaxBatch, width, device, mo);
  TestStream stream;
  DeviceBuffer full(size_t(R) * cols * 2), normed(size_t(R) * cols * 2), block(size_t(R) * width * 2), w(cols * 2),
      gs(4);
  GuardedBuffer sa(size_t(R) * cols / 2), ssf(size_t(R) * cols / 16), fa(size_t(R) * cols / 2),
      fsf(size_t(R) * cols / 16);
  uint64_t differing = 0;
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const auto rows = random_rows(R, cols, seed + chunk);  // the same on every rank
    // The stock path gets the blocks as the mailbox carries them: its
    // publisher stores -0.0 as +0.0 (the sentinel), and e2m1 keeps the sign
    // of zero (0x0 vs 0x8), so a -0.0 fed to stock alone would differ in that
    // sign only. The pooler GEMM practically never produces -0.0 (its FP32
    // sums start from +0.0; only a negative sum below BF16's smallest
    // subnormal rounds to -0.0), so on real data both paths see the same
    // blocks. The published block
    // below keeps its -0.0s, so the rewrite itself is exercised.
    auto stock_rows = rows;
    for (auto& v : stock_rows)
      if (v == 0x8000) v = 0;
    const auto weight = normal_bf16(cols, seed + 1000 + chunk, 0.3f);
    const float scale = kScales[chunk % 8];
    const float eps = chunk % 2 ? 1e-6f : sd::kMuseSpark.norm_eps;
    const float gc = chunk % 3 == 2 ? 0.5f : sd::kMuseSpark.gain_center;
    full.upload(stock_rows.data(), stock_rows.size() * 2);
    w.upload(weight.data(), weight.size() * 2);
    gs.upload(&scale, 4);
    const auto mine = block_of(rows, R, cols, rank, width);
    block.upload(mine.data(), mine.size() * 2);
    sa.fill(0x3c);
    ssf.fill(0x3c);
    fa.fill(0xcd);
    fsf.fill(0xcd);
    // Stock: the gathered rows, the norm kernel, the quantize kernel.
    sd::ExpertNorm norm(sd::TensorRef::contiguous(w.get(), sd::DType::bf16, {cols}, device), eps, gc);
    norm.run(full.get(), normed.get(), R, stream);
    sd::nvfp4_quantize(normed.get(), gs.as<float>(), sa.get(), ssf.get(), R, cols, stream);
    // Fused: publish this rank's block, consume every rank's.
    for_each_call(R, seed + 77 * chunk, [&](int off, int b) {
      mb.publish(block.as<uint16_t>() + size_t(off) * width, b, stream);
      sd::PoolerOutput o;
      o.format = sd::OutputFormat::nvfp4;
      o.a.data = static_cast<uint8_t*>(fa.get()) + size_t(off) * cols / 2;
      o.a_sf.data = static_cast<uint8_t*>(fsf.get()) + size_t(off) * cols / 16;
      sd::gather_norm(mb, w.get(), gs.as<float>(), eps, gc, o, b, stream, (off / 16) % 2 == 0);
    });
    mb.synchronize(stream);
    POOLER_REQUIRE((sa.check_guards() + ssf.check_guards() + fa.check_guards() + fsf.check_guards()).empty(),
                   "chunk ", chunk, ": guards");
    const auto a1 = download<uint8_t>(sa.get(), sa.bytes()), a2 = download<uint8_t>(fa.get(), fa.bytes());
    const auto s1 = download<uint8_t>(ssf.get(), ssf.bytes()), s2 = download<uint8_t>(fsf.get(), fsf.bytes());
    for (size_t i = 0; i < a1.size(); ++i)
      POOLER_REQUIRE(a1[i] == a2[i], "tp ", tp, " chunk ", chunk, " (gs ", scale, "): a row ", i / (cols / 2),
                     " byte ", i % (cols / 2), ": fused 0x", std::hex, int(a2[i]), " stock 0x", int(a1[i]));
    for (size_t i = 0; i < s1.size(); ++i)
      POOLER_REQUIRE(s1[i] == s2[i], "tp ", tp, " chunk ", chunk, " (gs ", scale, "): a_sf row ", i / (cols / 16),
                     " block ", i % (cols / 16), ": fused 0x", std::hex, int(s2[i]), " stock 0x", int(s1[i]));
    // Not a test that cannot fail: the outputs vary (a constant output
    // would also agree).
    size_t distinct = 0;
    for (size_t i = 1; i < s1.size(); ++i) distinct += s1[i] != s1[i - 1];
    differing += distinct;
  }
  // Over all chunks (one chunk's extreme global scale may saturate or
  // flush every block scale; the run as a whole must not).
  POOLER_REQUIRE(differing > uint64_t(chunks) * (size_t(R) * cols / 16) / 100, "degenerate scales over the run");
  mb.barrier();
  check_mailbox_guards(mb);
}

// Every output format of the fused consumer against the stock path on the
// same published blocks, call by call: b = 1..16 each once, then random b;
// random and adversarial rows (zeros, -0.0, subnormals, outliers that
// saturate E4M3 scales: random_rows). nvfp4: the codes and linear scales;
// nvfp4_swizzled: the codes and each call's [128, P/16] swizzled scales,
// padding included (poisoned before, zero after); bf16: the normed rows, bit
// for bit (the stock rows carry the publishers' -0.0 -> +0.0). Guard bytes
// around every output.
void formats_equal_stock(sd::Group& group, int device, uint64_t seed) {
  const int tp = group.size(), rank = group.rank(), cols = sd::kMuseSpark.pooled, width = cols / tp;
  const int R = 1024;
  std::vector<std::pair<int, int>> calls;  // (offset, b), the same on every rank
  {
    std::mt19937_64 g(seed + 9);
    int off = 0;
    for (int b = 1; b <= sd::kMaxBatch && off + b <= R; ++b) calls.push_back({off, b}), off += b;
    while (off < R) {
      const int b = std::min<int>(1 + int(g() % sd::kMaxBatch), R - off);
      calls.push_back({off, b});
      off += b;
    }
  }
  const size_t slot = size_t(sd::nvfp4_scale_rows(1, sd::ScaleLayout::swizzled)) * cols / 16;  // one call's a_sf
  sd::LamportMailbox mb(group, tp, rank, sd::kMaxBatch, width, device);
  TestStream stream;
  DeviceBuffer full(size_t(R) * cols * 2), block(size_t(R) * width * 2), w(cols * 2), gs(4);
  GuardedBuffer sn(size_t(R) * cols * 2), fn(size_t(R) * cols * 2), sa(size_t(R) * cols / 2), fa(size_t(R) * cols / 2),
      ssf(calls.size() * slot), fsf(calls.size() * slot);
  for (sd::OutputFormat format : {sd::OutputFormat::nvfp4, sd::OutputFormat::nvfp4_swizzled, sd::OutputFormat::bf16}) {
    const uint64_t fseed = seed + 101 * int(format);
    auto rows = random_rows(R, cols, fseed);
    const auto weight = normal_bf16(cols, fseed + 1, 0.3f);
    const float scale = format == sd::OutputFormat::nvfp4_swizzled ? 4096.0f : 2688.0f / 11.0f;
    const sd::ScaleLayout layout =
        format == sd::OutputFormat::nvfp4_swizzled ? sd::ScaleLayout::swizzled : sd::ScaleLayout::linear;
    auto stock_rows = rows;
    for (auto& v : stock_rows)
      if (v == 0x8000) v = 0;  // as the publishers store it
    full.upload(stock_rows.data(), stock_rows.size() * 2);
    w.upload(weight.data(), weight.size() * 2);
    gs.upload(&scale, 4);
    const auto mine = block_of(rows, R, cols, rank, width);
    block.upload(mine.data(), mine.size() * 2);
    for (GuardedBuffer* b : {&sn, &sa, &ssf}) b->fill(0x3c);
    for (GuardedBuffer* b : {&fn, &fa, &fsf}) b->fill(0xcd);
    sd::ExpertNorm norm(sd::TensorRef::contiguous(w.get(), sd::DType::bf16, {cols}, device), 1e-5f, 1.0f);
    norm.run(full.get(), sn.get(), R, stream);
    for (size_t c = 0; c < calls.size(); ++c) {
      const auto [off, b] = calls[c];
      mb.publish(block.as<uint16_t>() + size_t(off) * width, b, stream);
      sd::PoolerOutput o;
      o.format = format;
      o.normed.data = static_cast<uint16_t*>(fn.get()) + size_t(off) * cols;
      o.a.data = static_cast<uint8_t*>(fa.get()) + size_t(off) * cols / 2;
      o.a_sf.data = static_cast<uint8_t*>(fsf.get()) +
                    (layout == sd::ScaleLayout::swizzled ? c * slot : size_t(off) * cols / 16);
      sd::gather_norm(mb, w.get(), gs.as<float>(), 1e-5f, 1.0f, o, b, stream, true, c % 2 == 0);
      if (format != sd::OutputFormat::bf16)
        sd::nvfp4_quantize(static_cast<uint16_t*>(sn.get()) + size_t(off) * cols, gs.as<float>(),
                           static_cast<uint8_t*>(sa.get()) + size_t(off) * cols / 2,
                           static_cast<uint8_t*>(ssf.get()) +
                               (layout == sd::ScaleLayout::swizzled ? c * slot : size_t(off) * cols / 16),
                           b, cols, stream, true, layout);
    }
    mb.synchronize(stream);
    const std::string what = std::string("tp ") + std::to_string(tp) + " " + sd::format_name(format);
    POOLER_REQUIRE((sn.check_guards() + fn.check_guards() + sa.check_guards() + fa.check_guards() +
                    ssf.check_guards() + fsf.check_guards())
                       .empty(),
                   what, ": guards");
    if (format == sd::OutputFormat::bf16) {
      const auto s = download<uint16_t>(sn.get(), sn.bytes() / 2), f = download<uint16_t>(fn.get(), fn.bytes() / 2);
      for (size_t i = 0; i < s.size(); ++i)
        POOLER_REQUIRE(s[i] == f[i], what, ": row ", i / cols, " col ", i % cols, ": fused 0x", std::hex, f[i],
                       " stock 0x", s[i]);
      POOLER_REQUIRE(std::count(f.begin(), f.end(), kPoisonBf16) == 0, what, ": an element not written");
      continue;
    }
    const auto a1 = download<uint8_t>(sa.get(), sa.bytes()), a2 = download<uint8_t>(fa.get(), fa.bytes());
    for (size_t i = 0; i < a1.size(); ++i)
      POOLER_REQUIRE(a1[i] == a2[i], what, ": a row ", i / (cols / 2), " byte ", i % (cols / 2), ": fused 0x",
                     std::hex, int(a2[i]), " stock 0x", int(a1[i]));
    const size_t sf_bytes = layout == sd::ScaleLayout::swizzled ? calls.size() * slot : size_t(R) * cols / 16;
    const auto s1 = download<uint8_t>(ssf.get(), sf_bytes), s2 = download<uint8_t>(fsf.get(), sf_bytes);
    for (size_t i = 0; i < s1.size(); ++i)
      POOLER_REQUIRE(s1[i] == s2[i], what, ": a_sf byte ", i, ": fused 0x", std::hex, int(s2[i]), " stock 0x",
                     int(s1[i]));
    if (layout == sd::ScaleLayout::swizzled)
      for (size_t c = 0; c < calls.size(); ++c)
        for (int r = calls[c].second; r < 128; ++r)
          for (int k = 0; k < cols / 16; ++k)
            POOLER_REQUIRE(s2[c * slot + sd::nvfp4_scale_offset(r, k, cols, layout)] == 0, what, ": call ", c,
                           " padding row ", r, " column ", k, " not zero");
    size_t distinct = 0;
    for (size_t i = 1; i < s1.size(); ++i) distinct += s1[i] != s1[i - 1];
    POOLER_REQUIRE(distinct > s1.size() / 100, what, ": degenerate scales");
  }
  mb.barrier();
}

void edge_equals_stock_but_sign_of_zero(sd::Group& group, int device, uint64_t seed) {
  const int tp = group.size(), rank = group.rank(), cols = sd::kMuseSpark.pooled, width = cols / tp;
  const int R = kChunkRows / 4;
  sd::LamportMailbox mb(group, tp, rank, sd::kMaxBatch, width, device);
  TestStream stream;
  const auto rows = random_rows(R, cols, seed);
  const auto weight = normal_bf16(cols, seed + 1, 0.3f);
  DeviceBuffer full(size_t(R) * cols * 2), block(size_t(R) * width * 2), w(cols * 2), gathered(size_t(R) * cols * 2);
  GuardedBuffer stock(size_t(R) * cols * 2), ours(size_t(R) * cols * 2);
  full.upload(rows.data(), rows.size() * 2);
  w.upload(weight.data(), weight.size() * 2);
  const auto mine = block_of(rows, R, cols, rank, width);
  block.upload(mine.data(), mine.size() * 2);
  poison_bf16(stock);
  poison_bf16(ours);
  sd::ExpertNorm norm(sd::TensorRef::contiguous(w.get(), sd::DType::bf16, {cols}, device), 1e-5f, 1.0f);
  norm.run(full.get(), stock.get(), R, stream);
  for_each_call(R, seed + 3, [&](int off, int b) {
    mb.publish(block.as<uint16_t>() + size_t(off) * width, b, stream);
    mb.gather(gathered.as<uint16_t>() + size_t(off) * cols, b, stream);
    norm.run(gathered.as<uint16_t>() + size_t(off) * cols, static_cast<uint16_t*>(ours.get()) + size_t(off) * cols, b, stream);
  });
  mb.synchronize(stream);
  POOLER_REQUIRE((stock.check_guards() + ours.check_guards()).empty(), "guards");
  const auto s = download<uint16_t>(stock.get(), stock.bytes() / 2), o = download<uint16_t>(ours.get(), ours.bytes() / 2);
  // Both were poisoned: every element written (else equal poison would pass).
  POOLER_REQUIRE(std::count(s.begin(), s.end(), kPoisonBf16) == 0 && std::count(o.begin(), o.end(), kPoisonBf16) == 0,
                 "tp ", tp, ": an output element was not written");
  size_t zero_sign = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == o[i]) continue;
    const bool both_zero = (s[i] & 0x7fff) == 0 && (o[i] & 0x7fff) == 0;
    POOLER_REQUIRE(both_zero, "tp ", tp, " row ", i / cols, " col ", i % cols, ": ours 0x", std::hex, o[i],
                   " stock 0x", s[i]);
    ++zero_sign;
  }
  // The rows hold -0.0 (negative_zeros, zero_blocks): some zero signs must
  // differ, else the sentinel rewrite did not happen where the test thinks.
  POOLER_REQUIRE(zero_sign > 0, "no sign-of-zero difference: the inputs held no -0.0?");
  if (rank == 0) std::printf("edge tp %d: %zu zeros differ in sign only\n", tp, zero_sign);
  mb.barrier();
}

template <typename Fn>
bool throws_invalid(Fn fn) {
  try {
    fn();
  } catch (const sd::InvalidArgument&) {
    return true;
  }
  return false;
}

// PoolerGemm::run_publish vs run + LamportMailbox::publish on a second
// mailbox with the same history, for the table's engines and every forced
// one, every b in 1..16 (one shuffled order on all ranks), at the model's
// shard [P/tp, H]: the same out, the same bytes in the whole mailbox
// allocation (data, stage words, guards), and the same gathered rows, whose
// own block is out with -0.0 as +0.0. shard_n, k > 0: a weight of that
// shape instead (engines that cannot serve it are skipped); `only`: that
// engine alone.
void gemm_publish_equals_run_plus_publish(sd::Group& group, int device, uint64_t seed, int shard_n = 0,
                                          int shard_k = 0, std::optional<sd::GemmEngine> only = std::nullopt) {
  const int tp = group.size(), rank = group.rank(), M = sd::kMaxBatch;
  const int n = shard_n > 0 ? shard_n : sd::kMuseSpark.pooled / tp;
  const int k = shard_k > 0 ? shard_k : sd::kMuseSpark.hidden;
  std::mt19937_64 gen(seed * 31 + rank);
  auto w = random_bf16(size_t(n) * k, Dist::scaled, -4, gen);
  auto x = random_bf16(size_t(M) * k, Dist::specials, 0, gen);  // -0.0, subnormals, extremes
  // Row 0 makes -0.0 outputs, which the publish must store as +0.0: x[0] is
  // 2^-100 at column 0 and zero elsewhere, and every third weight row has
  // -2^-40 there, so those outputs are -2^-140 in FP32, which rounds to
  // BF16 -0.0 (below half of BF16's least subnormal, 2^-133).
  std::fill(x.begin(), x.begin() + k, uint16_t{0});
  x[0] = 0x0d80;  // 2^-100
  for (int c = 0; c < n; c += 3) w[size_t(c) * k] = 0xab80;  // -2^-40
  long negative_zeros = 0;
  DeviceBuffer dw(w.size() * 2), dx(x.size() * 2);
  dw.upload(w.data(), w.size() * 2);
  dx.upload(x.data(), x.size() * 2);
  GuardedBuffer out_a(size_t(M) * n * 2), out_b(size_t(M) * n * 2);
  GuardedBuffer rows_a(size_t(M) * n * tp * 2), rows_b(size_t(M) * n * tp * 2);
  const auto weight = sd::TensorRef::contiguous(dw.get(), sd::DType::bf16, {n, k}, device);
  const auto engines = table_and_candidates();
  std::vector<int> order;
  for (int b = 1; b <= M; ++b) order.push_back(b);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
  {
    // Refused before anything launches: a mailbox of another width, one too
    // small for a prepared batch, and run_publish without a mailbox.
    sd::LamportMailbox narrow(group, tp, rank, M, n / 2, device), small(group, tp, rank, 4, n, device);
    sd::PoolerGemm::Options o;
    o.mailbox = &narrow;
    POOLER_REQUIRE(throws_invalid([&] { sd::PoolerGemm(weight, tp, o); }), "a mailbox of width N/2 was accepted");
    o.mailbox = &small;
    POOLER_REQUIRE(throws_invalid([&] { sd::PoolerGemm(weight, tp, o); }), "batch 16 > capacity 4 was accepted");
    o.batches = {1, 4};
    sd::PoolerGemm fits(weight, tp, o);  // batches within the capacity: fine
    sd::PoolerGemm none(weight, tp);
    POOLER_REQUIRE(throws_invalid([&] { none.run_publish(dx.get(), out_a.get(), 1, nullptr); }),
                   "run_publish without a mailbox was accepted");
  }
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (const auto& engine : engines) {
    if (only && (!engine || engine->engine != *only)) continue;
    const std::string what = engine ? engine->to_string() : std::string("table");
    // Guard bytes around both mailboxes' data and state: a fused store
    // outside its slot would change them (checked below, and compared).
    sd::LamportMailbox::Options guarded;
    guarded.guard_bytes = 4096;
    sd::LamportMailbox a(group, tp, rank, M, n, device, guarded), b(group, tp, rank, M, n, device, guarded);
    sd::PoolerGemm::Options fo, po;
    fo.force = po.force = engine;
    fo.batches = po.batches = servable(engine, n, k, order);
    if (fo.batches.empty()) continue;  // this engine cannot take [n, k] (no batch means all to PoolerGemm)
    fo.mailbox = &a;
    sd::PoolerGemm fused(weight, tp, fo), plain(weight, tp, po);
    for (int m : fo.batches) {
      poison_bf16(out_a);
      poison_bf16(out_b);
      fused.run_publish(dx.get(), out_a.get(), m, stream);
      plain.run(dx.get(), out_b.get(), m, stream);
      b.publish(out_b.get(), m, stream);
      a.synchronize(stream);
      group.barrier();  // every rank has published into every copy
      std::vector<uint16_t> ya(size_t(M) * n), yb(size_t(M) * n);
      out_a.download(ya.data(), ya.size() * 2);
      out_b.download(yb.data(), yb.size() * 2);
      POOLER_REQUIRE(ya == yb, what, " m ", m, ": out differs from the plain run");
      negative_zeros += std::count(ya.begin(), ya.begin() + size_t(m) * n, sd::kBf16NegativeZero);
      POOLER_REQUIRE(out_a.check_guards().empty() && out_b.check_guards().empty(), what, " m ", m, ": out guards ",
                     out_a.check_guards(), out_b.check_guards());
      const auto bytes_a = download<uint8_t>(a.memory().local(), a.memory().bytes());
      const auto bytes_b = download<uint8_t>(b.memory().local(), b.memory().bytes());
      POOLER_REQUIRE(bytes_a == bytes_b, what, " m ", m, ": mailbox bytes (data, stage words or guards) differ from publish()'s");
      check_mailbox_guards(a);
      group.barrier();  // nobody gathers (and clears) before every rank compared
      poison_bf16(rows_a);
      poison_bf16(rows_b);
      a.gather(rows_a.get(), m, stream);
      b.gather(rows_b.get(), m, stream);
      a.synchronize(stream);
      std::vector<uint16_t> ra(size_t(m) * n * tp), rb(size_t(m) * n * tp);
      rows_a.download(ra.data(), ra.size() * 2);
      rows_b.download(rb.data(), rb.size() * 2);
      POOLER_REQUIRE(ra == rb, what, " m ", m, ": gathered rows differ");
      POOLER_REQUIRE(rows_a.check_guards().empty() && rows_b.check_guards().empty(), what, " m ", m,
                     ": gathered rows' guards");
      for (int r = 0; r < m; ++r)
        for (int c = 0; c < n; ++c) {
          const uint16_t y = ya[size_t(r) * n + c], got = ra[(size_t(r) * tp + rank) * n + c];
          POOLER_REQUIRE(got == (y == sd::kBf16NegativeZero ? 0 : y), what, " m ", m, " row ", r, " col ", c,
                         ": gathered ", got, " for out ", y);
        }
      group.barrier();
    }
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
  POOLER_REQUIRE(negative_zeros > 0, "no output was -0.0: the publish's -0.0 -> +0.0 rewrite went unchecked");
}

}  // namespace

TEST(PoolerGemmPublish, FusedEqualsRunPlusPublishOneGpu) {
  SKIP_WITHOUT_GPU(1);
  const uint64_t seed = test_seed("gemm publish tp1");
  for (const auto& f : run_on_gpus(1, [&](sd::Group& g, int d) { gemm_publish_equals_run_plus_publish(g, d, seed); }))
    ADD_FAILURE() << f;
}

// The ring engine's fused publish where a CTA owns several tiles (the model
// shards give each one): N = 32 (2 SMs + 7), K = 2048 (2 stages per warp
// and tile).
TEST(PoolerGemmPublish, FusedEqualsRunPlusPublishSeveralTilesPerCta) {
  SKIP_WITHOUT_GPU(1);
  const uint64_t seed = test_seed("gemm publish tiles");
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int n = sd::kRingRows * (2 * sms + 7), k = 2 * sd::kRingKMultiple;
  for (const auto& f :
       run_on_gpus(1, [&](sd::Group& g, int d) { gemm_publish_equals_run_plus_publish(g, d, seed, n, k); }))
    ADD_FAILURE() << f;
}

TEST(PoolerGemmPublish, FusedEqualsRunPlusPublishTwoGpus) {
  const std::string why = peer_gpus_unavailable_reason(2);
  if (!why.empty()) GTEST_SKIP() << why;
  const uint64_t seed = test_seed("gemm publish tp2");
  for (const auto& f : run_on_gpus(2, [&](sd::Group& g, int d) { gemm_publish_equals_run_plus_publish(g, d, seed); }))
    ADD_FAILURE() << f;
}

// Two ranks sharing one GPU: the tp-2 stores (column pairs into the peer's
// copy) where no second GPU is lent; host barriers separate publish and gather.
TEST(PoolerGemmPublish, FusedEqualsRunPlusPublishTwoRanksOnOneGpu) {
  SKIP_WITHOUT_GPU(1);
  const uint64_t seed = test_seed("gemm publish tp2 one gpu");
  for (const auto& f :
       run_on_gpus(2, [&](sd::Group& g, int d) { gemm_publish_equals_run_plus_publish(g, d, seed); }, 1))
    ADD_FAILURE() << f;
}

// The on-chip engine's fused publish at the tp 4 and tp 8 shards (P/tp =
// 1024, 512 at K = H; stores into 4 or 8 copies), ranks sharing one GPU:
// host barriers separate publish and gather.
TEST(PoolerGemmPublish, OnchipFusedEqualsRunPlusPublishAtTp4AndTp8OnOneGpu) {
  SKIP_WITHOUT_GPU(1);
  const uint64_t seed = test_seed("gemm publish onchip");
  for (int tp : {4, 8})
    for (const auto& f : run_on_gpus(
             tp,
             [&](sd::Group& g, int d) {
               gemm_publish_equals_run_plus_publish(g, d, seed + tp, 0, 0, sd::GemmEngine::onchip_mma);
             },
             1))
      ADD_FAILURE() << "tp " << tp << ": " << f;
}

TEST(PoolerFused, EqualsStockBitForBitOneGpu) {
  SKIP_WITHOUT_GPU(1);
  const uint64_t seed = test_seed("fused tp1");
  for (const auto& f : run_on_gpus(1, [&](sd::Group& g, int d) { fused_equals_stock(g, d, 8, seed); }))
    ADD_FAILURE() << f;
}

TEST(PoolerFused, EqualsStockBitForBitTwoGpus) {
  const std::string why = peer_gpus_unavailable_reason(2);
  if (!why.empty()) GTEST_SKIP() << why;
  const uint64_t seed = test_seed("fused tp2");
  for (const auto& f : run_on_gpus(2, [&](sd::Group& g, int d) { fused_equals_stock(g, d, 8, seed); }))
    ADD_FAILURE() << f;
}

TEST(PoolerFused, EqualsStockAtTp4OnTwoGpus) {
  const std::string why = peer_gpus_unavailable_reason(2);
  if (!why.empty()) GTEST_SKIP() << why;
  const uint64_t seed = test_seed("fused tp4");
  for (const auto& f : run_on_gpus(4, [&](sd::Group& g, int d) { fused_equals_stock(g, d, 2, seed); }, 2))
    ADD_FAILURE() << f;
}

// A fused consumer with no publish since the last consume (the default
// OnFailure::poison): the named error at once, and every output of the call
// holds the poison of its format (docs/design.md, "Failures"), never the
// last call's rows; the mailbox then refuses every entry point.
void consumer_failure_poisons(sd::Group& group, int device, uint64_t seed) {
  const int tp = group.size(), rank = group.rank(), cols = sd::kMuseSpark.pooled, width = cols / tp, b = 5;
  const auto rows = random_rows(b, cols, seed);
  const auto mine = block_of(rows, b, cols, rank, width);
  const auto weight = normal_bf16(cols, seed + 1, 0.3f);
  const float scale = 100.0f;
  for (sd::OutputFormat format : {sd::OutputFormat::bf16, sd::OutputFormat::nvfp4, sd::OutputFormat::nvfp4_swizzled}) {
    const std::string what = std::string("tp ") + std::to_string(tp) + " " + sd::format_name(format);
    const sd::ScaleLayout layout =
        format == sd::OutputFormat::nvfp4_swizzled ? sd::ScaleLayout::swizzled : sd::ScaleLayout::linear;
    const size_t sf_bytes = size_t(sd::nvfp4_scale_rows(b, layout)) * cols / 16;
    sd::LamportMailbox::Options options;
    options.spin_timeout_s = 2.0;
    sd::LamportMailbox mb(group, tp, rank, sd::kMaxBatch, width, device, options);
    TestStream stream;
    DeviceBuffer block(size_t(b) * width * 2), w(cols * 2), gs(4);
    GuardedBuffer normed(size_t(b) * cols * 2), a(size_t(b) * cols / 2), a_sf(sf_bytes);
    block.upload(mine.data(), mine.size() * 2);
    w.upload(weight.data(), weight.size() * 2);
    gs.upload(&scale, 4);
    sd::PoolerOutput o;
    o.format = format;
    o.normed.data = normed.get();
    o.a.data = a.get();
    o.a_sf.data = a_sf.get();
    mb.publish(block.get(), b, stream);
    sd::gather_norm(mb, w.get(), gs.as<float>(), 1e-5f, 1.0f, o, b, stream);
    mb.synchronize(stream);
    group.barrier();
    for (GuardedBuffer* buf : {&normed, &a, &a_sf}) buf->fill(0x3c);
    const auto start = std::chrono::steady_clock::now();
    sd::gather_norm(mb, w.get(), gs.as<float>(), 1e-5f, 1.0f, o, b, stream);  // no publish
    std::string error;
    try {
      mb.synchronize(stream);
    } catch (const sd::RuntimeError& e) {
      error = e.what();
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    POOLER_REQUIRE(error.find("no publish since the last consume") != std::string::npos, what, ": '", error, "'");
    POOLER_REQUIRE(waited < 1.0, what, ": the error took ", waited, " s");
    POOLER_REQUIRE((normed.check_guards() + a.check_guards() + a_sf.check_guards()).empty(), what, ": guards");
    if (format == sd::OutputFormat::bf16) {
      const auto f = download<uint16_t>(normed.get(), normed.bytes() / 2);
      for (size_t i = 0; i < f.size(); ++i)
        POOLER_REQUIRE(f[i] == 0xffff, what, ": normed element ", i, " = 0x", std::hex, f[i], ", not the poison");
    } else {
      const auto codes = download<uint8_t>(a.get(), a.bytes()), sf = download<uint8_t>(a_sf.get(), sf_bytes);
      for (size_t i = 0; i < codes.size(); ++i)
        POOLER_REQUIRE(codes[i] == 0, what, ": code byte ", i, " = 0x", std::hex, int(codes[i]));
      for (int r = 0; r < sd::nvfp4_scale_rows(b, layout); ++r)
        for (int k = 0; k < cols / 16; ++k) {
          const uint8_t got = sf[sd::nvfp4_scale_offset(r, k, cols, layout)];
          POOLER_REQUIRE(got == (r < b ? 0x7f : 0), what, ": scale row ", r, " column ", k, " = 0x", std::hex,
                         int(got));
        }
    }
    std::string refused;
    try {
      sd::gather_norm(mb, w.get(), gs.as<float>(), 1e-5f, 1.0f, o, b, stream);
    } catch (const sd::RuntimeError& e) {
      refused = e.what();
    }
    POOLER_REQUIRE(refused.find("destroy this mailbox") != std::string::npos, what, ": after the failure: '",
                   refused, "'");
    group.barrier();
  }
}

TEST(PoolerFormats, ConsumerFailurePoisonsEveryFormatTp1Tp2OnOneGpu) {
  SKIP_WITHOUT_GPU(1);
  const uint64_t seed = test_seed("pooler consumer failure");
  for (const int tp : {1, 2})
    for (const auto& f : run_on_gpus(tp, [&](sd::Group& g, int d) { consumer_failure_poisons(g, d, seed); }, 1))
      ADD_FAILURE() << "tp " << tp << ": " << f;
}

TEST(PoolerFormats, EveryFormatEqualsStockOneGpu) {
  SKIP_WITHOUT_GPU(1);
  const uint64_t seed = test_seed("pooler formats");
  for (const auto& f : run_on_gpus(1, [&](sd::Group& g, int d) { formats_equal_stock(g, d, seed); })) ADD_FAILURE() << f;
}

// Two ranks on one GPU: the multi-rank paths (two sources per row, two
// copies) where one GPU is lent.
TEST(PoolerFormats, EveryFormatEqualsStockTp2OnOneGpu) {
  SKIP_WITHOUT_GPU(1);
  const uint64_t seed = test_seed("pooler formats");
  for (const auto& f : run_on_gpus(2, [&](sd::Group& g, int d) { formats_equal_stock(g, d, seed); }, 1))
    ADD_FAILURE() << f;
}

TEST(PoolerFormats, EveryFormatEqualsStockTwoGpus) {
  const std::string why = peer_gpus_unavailable_reason(2);
  if (!why.empty()) GTEST_SKIP() << why;
  const uint64_t seed = test_seed("pooler formats");
  for (const auto& f : run_on_gpus(2, [&](sd::Group& g, int d) { formats_equal_stock(g, d, seed); })) ADD_FAILURE() << f;
}

TEST(PoolerEdge, EqualsStockExceptSignOfZero) {
  SKIP_WITHOUT_GPU(1);
  const uint64_t seed = test_seed("edge");
  for (const auto& f : run_on_gpus(1, [&](sd::Group& g, int d) { edge_equals_stock_but_sign_of_zero(g, d, seed); }))
    ADD_FAILURE() << f;
  if (peer_gpus_unavailable_reason(2).empty())
    for (const auto& f : run_on_gpus(2, [&](sd::Group& g, int d) { edge_equals_stock_but_sign_of_zero(g, d, seed); }))
      ADD_FAILURE() << f;
}
