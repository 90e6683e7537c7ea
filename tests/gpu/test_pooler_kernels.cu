// The Pooler's kernels on one GPU: the stock NVFP4 quantize kernel against
// the CPU reference (counting and bounding the rcp.approx differences),
// ExpertNorm against an FP64 model, and the pooler GEMM (every compiled
// skinny shape, the table, the MMA engine) against the FP64 GEMM reference,
// bitwise reproducible and batch invariant; outputs poisoned, guards intact.
#include <cuda_fp4.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <utility>

#include "kernels/nvfp4/nvfp4.cuh"
#include "pooler_test_util.h"
#include "spark_decode/expert_norm.h"
#include "spark_decode/model_shape.h"
#include "spark_decode/nvfp4.h"
#include "spark_decode/pooler_gemm.h"
#include "spark_decode/reference.h"

namespace sd = spark_decode;
using namespace sd::testing;
using namespace sd::testing::pooler_tests;

TEST(PoolerNvfp4, GpuQuantizerEqualsCpuReferenceExceptRcpApprox) {
  SKIP_WITHOUT_GPU(1);
  const uint64_t seed = test_seed("nvfp4 gpu vs cpu");
  const int rows = 8192, cols = sd::kMuseSpark.pooled;
  // gs in FP32's normal range (rcp.approx.ftz flushes subnormals; no model
  // uses one): typical (448 * 6 / amax), 1, and far from 1 both ways.
  const float scales[] = {1.0f, 2688.0f / 7.3f, 0.0371f, 0x1p-20f, 0x1p24f};
  const auto y = random_rows(rows, cols, seed);
  DeviceBuffer dy(y.size() * 2), dgs(4);
  dy.upload(y.data(), y.size() * 2);
  GuardedBuffer da(size_t(rows) * cols / 2), dsf(size_t(rows) * cols / 16);
  TestStream stream;
  uint64_t codes = 0, code_diffs = 0, blocks = 0, sf_diffs = 0;
  for (float gs : scales) {
    dgs.upload(&gs, 4);
    da.fill(0xcd);
    dsf.fill(0xcd);
    sd::nvfp4_quantize(dy.get(), dgs.as<float>(), da.get(), dsf.get(), rows, cols, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    ASSERT_EQ(da.check_guards() + dsf.check_guards(), "");
    std::vector<uint8_t> a(size_t(rows) * cols / 2), sf(size_t(rows) * cols / 16);
    da.download(a.data(), a.size());
    dsf.download(sf.data(), sf.size());
    std::vector<uint8_t> ra(a.size()), rsf(sf.size());
    sd::reference::nvfp4_quantize(y.data(), rows, cols, gs, ra.data(), rsf.data());
    for (size_t blk = 0; blk < sf.size(); ++blk) {
      ++blocks;
      float yb[16];
      for (int i = 0; i < 16; ++i) yb[i] = sd::bf16_to_float(y[blk * 16 + i]);
      float vmax = 0;
      for (float v : yb) vmax = std::fmax(vmax, std::fabs(v));
      if (sf[blk] != rsf[blk]) {
        // Only rcp.approx(6) against the exact 1/6 can move sf: the scale
        // must lie at an E4M3 midpoint to within a few ulps, and the two
        // bytes must be neighbours.
        ++sf_diffs;
        const float sf_value = gs * (vmax * (1.0f / 6.0f));
        ASSERT_EQ(std::abs(int(sf[blk]) - int(rsf[blk])), 1) << "gs " << gs << " block " << blk;
        ASSERT_LE(sd::reference::e4m3_midpoint_distance(sf_value), 0x1p-20) << "gs " << gs << " block " << blk;
        continue;  // its codes use another scale
      }
      const float sff = sd::e4m3_to_float(rsf[blk]);
      const float os = sff == 0.0f ? 0.0f : 1.0f / (sff * (1.0f / gs));
      for (int i = 0; i < 16; ++i) {
        ++codes;
        const uint8_t g = (a[blk * 8 + i / 2] >> (4 * (i & 1))) & 0xf;
        const uint8_t r = (ra[blk * 8 + i / 2] >> (4 * (i & 1))) & 0xf;
        if (g == r) continue;
        // rcp.approx's error moves y * out_scale by a few ulps: a code may
        // differ only to its neighbour, only for a product that lies within
        // 2^-20 (relative) of a rounding threshold.
        ++code_diffs;
        const float p = yb[i] * os;
        ASSERT_EQ(g & 8, r & 8) << "sign, gs " << gs << " block " << blk << " i " << i;
        ASSERT_EQ(std::abs(int(g & 7) - int(r & 7)), 1) << "gs " << gs << " block " << blk << " i " << i;
        ASSERT_LE(sd::reference::e2m1_threshold_distance(p), 0x1p-20) << "gs " << gs << " block " << blk << " i " << i << " p " << p;
      }
    }
  }
  std::printf("GPU vs CPU reference: %llu of %llu scale bytes and %llu of %llu codes differ (rcp.approx vs exact "
              "division), each at a rounding boundary\n",
              (unsigned long long)sf_diffs, (unsigned long long)blocks, (unsigned long long)code_diffs,
              (unsigned long long)codes);
  // Boundaries are rare in random data: a difference rate above 1e-4 would
  // mean something other than the reciprocal differs.
  EXPECT_LE(code_diffs, codes / 10000);
  EXPECT_LE(sf_diffs, blocks / 10000);
}

// Every float32 bit pattern through the E2M1 conversion the quantizers run
// on this GPU (e2m1.h's software form on sm_90a, the instruction
// where it exists) against CUDA's own device conversion (cuda_fp4.h). The
// CPU test checks the same formula exhaustively on the host; this one checks
// what the device compiler made of it (contraction, flushing).
__global__ void e2m1_sweep_kernel(unsigned long long* mismatches, unsigned int* first) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  unsigned long long bad = 0;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (uint64_t{1} << 32); i += stride) {
    const float f = __uint_as_float(static_cast<uint32_t>(i));
    const uint32_t want = __nv_cvt_float_to_fp4(f, __NV_E2M1, cudaRoundNearest);
    const uint32_t ours = sd::kernels::nvfp4::cvt_e2m1x2_f32(0.0f, f) & 0xfu;
    const uint32_t formula = sd::nvfp4_common::e2m1_code(f);
    if (ours != want || formula != want) {
      ++bad;
      atomicMin(first, static_cast<uint32_t>(i));
    }
  }
  if (bad) atomicAdd(mismatches, bad);
}

TEST(PoolerNvfp4, DeviceE2m1EqualsCudasConversionForEveryFloat) {
  SKIP_WITHOUT_GPU(1);
  DeviceBuffer mismatches(sizeof(unsigned long long)), first(sizeof(unsigned int));
  const unsigned long long zero = 0;
  const unsigned int none = 0xffffffffu;
  mismatches.upload(&zero, sizeof zero);
  first.upload(&none, sizeof none);
  e2m1_sweep_kernel<<<1024, 256>>>(mismatches.as<unsigned long long>(), first.as<unsigned int>());
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
  unsigned long long bad = 0;
  unsigned int at = 0;
  CUDA_CHECK(cudaMemcpy(&bad, mismatches.get(), sizeof bad, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(&at, first.get(), sizeof at, cudaMemcpyDeviceToHost));
  EXPECT_EQ(bad, 0u) << "first mismatching float bits 0x" << std::hex << at;
}

TEST(PoolerNvfp4, RefusesBadArguments) {
  SKIP_WITHOUT_GPU(1);
  DeviceBuffer y(64 * 2), a(64), sf(16), gs(4);
  EXPECT_THROW(sd::nvfp4_quantize(y.get(), gs.as<float>(), a.get(), sf.get(), 1, 40, nullptr), sd::InvalidArgument);
  EXPECT_THROW(sd::nvfp4_quantize(y.get(), gs.as<float>(), a.get(), sf.get(), 0, 64, nullptr), sd::InvalidArgument);
  EXPECT_THROW(sd::nvfp4_quantize(y.as<char>() + 2, gs.as<float>(), a.get(), sf.get(), 1, 32, nullptr),
               sd::InvalidArgument);
  EXPECT_THROW(sd::nvfp4_quantize(y.get(), gs.as<float>(), y.get(), sf.get(), 1, 64, nullptr), sd::InvalidArgument);
  try {
    sd::nvfp4_quantize(y.get(), sf.as<float>(), a.get(), sf.get(), 1, 64, nullptr);
    ADD_FAILURE() << "a_sf over the global scale accepted";
  } catch (const sd::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("may not overlap the global scale"), std::string::npos) << e.what();
  }
}

TEST(PoolerExpertNorm, WithinOneBf16UlpOfTheCpuReference) {
  SKIP_WITHOUT_GPU(1);
  const uint64_t seed = test_seed("expert norm");
  std::mt19937_64 g(seed);
  for (int cols : {512, sd::kMuseSpark.pooled}) {
    const int rows = 777;
    std::vector<uint16_t> x(size_t(rows) * cols);
    // Finite-mean distributions (huge rows overflow mean(x^2) in FP32 by
    // design; the bit-exactness tests cover them).
    const RowDist dists[] = {RowDist::normal, RowDist::heavy_tailed, RowDist::zero_blocks, RowDist::negative_zeros,
                             RowDist::subnormals, RowDist::tiny};
    for (int r = 0; r < rows; ++r) random_row(x.data() + size_t(r) * cols, cols, dists[r % 6], g);
    const auto w = normal_bf16(cols, seed + cols, 0.2f);
    const float eps = 1e-5f, gc = 1.0f;
    DeviceBuffer dx(x.size() * 2), dw(w.size() * 2);
    dx.upload(x.data(), x.size() * 2);
    dw.upload(w.data(), w.size() * 2);
    GuardedBuffer dy(x.size() * 2);
    poison_bf16(dy);
    sd::ExpertNorm norm(sd::TensorRef::contiguous(dw.get(), sd::DType::bf16, {cols}, 0), eps, gc);
    norm.run(dx.get(), dy.get(), rows, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    ASSERT_EQ(dy.check_guards(), "");
    std::vector<uint16_t> y(x.size()), ref(x.size());
    dy.download(y.data(), y.size() * 2);
    ASSERT_EQ(std::count(y.begin(), y.end(), kPoisonBf16), 0) << "cols " << cols << ": an element was not written";
    // PDL off gives the same bits.
    sd::ExpertNorm norm_off(sd::TensorRef::contiguous(dw.get(), sd::DType::bf16, {cols}, 0), eps, gc, false);
    poison_bf16(dy);
    norm_off.run(dx.get(), dy.get(), rows, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> y_off(x.size());
    dy.download(y_off.data(), y_off.size() * 2);
    ASSERT_EQ(y_off, y) << "cols " << cols << ": PDL off differs from on";
    std::vector<double> exacts;
    sd::reference::expert_norm(x.data(), w.data(), ref.data(), rows, cols, eps, gc, &exacts);
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        const double exact = exacts[size_t(r) * cols + c];
        const double got = sd::bf16_to_float(y[size_t(r) * cols + c]);
        // One BF16 rounding (half an ulp) of a value the FP32 arithmetic and
        // rsqrt.approx (~2^-22 relative) moved slightly: within one BF16 ulp
        // of the exact value (the ulp of its binade; 2^-133 below 2^-126).
        const double ulp = std::ldexp(1.0, std::max(std::ilogb(exact), -126) - 7);
        ASSERT_LE(std::fabs(got - exact), ulp)
            << "cols " << cols << " row " << r << " col " << c << " got " << got << " exact " << exact;
      }
    }
  }
}

TEST(PoolerExpertNorm, RefusesBadArguments) {
  SKIP_WITHOUT_GPU(1);
  DeviceBuffer w(4096 * 2), x(4096 * 2 * 2), y(4096 * 2 * 2);
  EXPECT_THROW(sd::ExpertNorm(sd::TensorRef::contiguous(w.get(), sd::DType::bf16, {500}, 0), 1e-5f, 1.0f),
               sd::InvalidArgument);
  EXPECT_THROW(sd::ExpertNorm(sd::TensorRef::contiguous(w.get(), sd::DType::f32, {512}, 0), 1e-5f, 1.0f),
               sd::InvalidArgument);
  sd::ExpertNorm norm(sd::TensorRef::contiguous(w.get(), sd::DType::bf16, {4096}, 0), 1e-5f, 1.0f);
  EXPECT_THROW(norm.run(x.get(), x.get(), 1, nullptr), sd::InvalidArgument);  // y overlaps x
  EXPECT_THROW(norm.run(x.as<char>() + 2, y.get(), 1, nullptr), sd::InvalidArgument);
  EXPECT_THROW(norm.run(x.get(), y.get(), 0, nullptr), sd::InvalidArgument);
  try {
    norm.run(x.get(), w.get(), 1, nullptr);
    ADD_FAILURE() << "y over the norm weight accepted";
  } catch (const sd::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("y may not overlap the norm weight"), std::string::npos) << e.what();
  }
}

namespace {

// Runs a GEMM (`run(w, x, out, m, pdl)`) for every m in 1..16 that `ms` lists
// on [n, k]: accuracy against FP64, every element of rows < m written and
// rows >= m untouched, guards intact, PDL on bit-identical to PDL off (and
// so a second run to the first), and every row equal to the same row
// computed alone (m = 1) and in every larger batch.
template <typename Run>
void gemm_checks(const std::string& what, const std::vector<int>& ms, int n, int k, Dist dist, uint64_t seed,
                 Run run) {
  const int M = sd::kMaxBatch;
  POOLER_REQUIRE(!ms.empty() && ms.front() == 1, what, " serves no batch at n ", n, " k ", k);
  const auto [w, x] = gemm_operands(n, k, M, dist, seed);
  DeviceBuffer dw(w.size() * 2), dx(x.size() * 2);
  dw.upload(w.data(), w.size() * 2);
  dx.upload(x.data(), x.size() * 2);
  GuardedBuffer out(size_t(M) * n * 2), again(size_t(M) * n * 2), alone(size_t(n) * 2);
  std::vector<std::vector<uint16_t>> results(M + 1);
  for (int m : ms) {
    poison_bf16(out);
    poison_bf16(again);
    run(dw.get(), dx.get(), out.get(), m, false);
    run(dw.get(), dx.get(), again.get(), m, true);
    CUDA_CHECK(cudaDeviceSynchronize());
    POOLER_REQUIRE(out.check_guards().empty() && again.check_guards().empty(), what, " m ", m, ": guards ",
                   out.check_guards(), again.check_guards());
    std::vector<uint16_t> o(size_t(M) * n), a(size_t(M) * n);
    out.download(o.data(), o.size() * 2);
    again.download(a.data(), a.size() * 2);
    for (size_t i = 0; i < o.size(); ++i) {
      const bool live = i < size_t(m) * n;
      POOLER_REQUIRE(live ? o[i] != kPoisonBf16 : o[i] == kPoisonBf16, what, " m ", m, " element ", i,
                     live ? " not written" : " written past m rows");
      POOLER_REQUIRE(o[i] == a[i], what, " m ", m, " element ", i, " differs between PDL off and on");
    }
    o.resize(size_t(m) * n);
    results[m] = o;
  }
  // Accuracy at the largest batch; the other batches equal it row for row
  // (batch invariance, below).
  const std::string bad = check_gemm(results[ms.back()], x.data(), w.data(), ms.back(), n, k);
  POOLER_REQUIRE(bad.empty(), what, " n ", n, " k ", k, " m ", ms.back(), ": ", bad);
  for (int r = 0; r < ms.back(); ++r) {
    poison_bf16(alone);
    run(dw.get(), dx.as<uint16_t>() + size_t(r) * k, alone.get(), 1, true);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> one(n);
    alone.download(one.data(), n * 2);
    for (int m : ms)
      if (m > r)
        for (int j = 0; j < n; ++j)
          POOLER_REQUIRE(results[m][size_t(r) * n + j] == one[j], what, ": row ", r, " col ", j, " in a batch of ", m,
                         " differs from the row alone (batch invariance)");
  }
}

std::vector<int> all_batches() {
  std::vector<int> ms;
  for (int m = 1; m <= sd::kMaxBatch; ++m) ms.push_back(m);
  return ms;
}

}  // namespace

TEST(PoolerGemm, EverySkinnyShapeIsAccurateReproducibleAndBatchInvariant) {
  SKIP_WITHOUT_GPU(1);
  const uint64_t seed = test_seed("skinny gemm");
  for (const auto& shape : sd::pooler_gemm_shapes()) {
    // K = H (one chunk) and 2 H (two chunks, the weight reloaded in the loop);
    // a small N (cheap reference) that leaves few CTAs.
    for (int k : {sd::kMuseSpark.hidden, 2 * sd::kMuseSpark.hidden})
      for (Dist dist : kAllDists) {
        try {
          gemm_checks(shape.to_string() + " " + dist_name(dist), all_batches(), 64, k, dist, seed + k + int(dist),
                      [&](const void* w, const void* x, void* out, int m, bool pdl) {
                        sd::skinny_gemm(shape, w, x, out, 64, k, m, nullptr, pdl);
                      });
        } catch (const std::exception& e) {
          ADD_FAILURE() << e.what();
        }
      }
  }
}

// The ring engine where a CTA streams several tiles back to back (tiles over
// at most one CTA per SM), with fewer stages per warp than its ring is deep
// (K = 1024: one stage per tile), several (3072) and many (8192): every
// distribution, every batch, through PoolerGemm as the Pooler uses it.
TEST(PoolerGemm, RingEngineOverSeveralTilesPerCta) {
  SKIP_WITHOUT_GPU(1);
  const uint64_t seed = test_seed("pooler gemm ring");
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  {
    const sd::PoolerGemmChoice ring{sd::GemmEngine::ring_mma, {}};
    const int rows = sd::kRingRows, km = sd::kRingKMultiple;
    // Tiles: 2 or 3 per CTA, more, and fewer than there are SMs.
    for (auto [n, k] : {std::pair{rows * (2 * sms + 7), km}, {rows * (sms + 3), 3 * km}, {rows * 5, 8192}})
      for (Dist dist : kAllDists) {
        try {
          // One PoolerGemm per weight (the buffer gemm_checks uploads), made on
          // its first use: pointers are the test's; construction prepares.
          std::unique_ptr<sd::PoolerGemm> on, off;
          const void* made_for = nullptr;
          gemm_checks(ring.to_string() + " " + dist_name(dist), all_batches(), n, k, dist, seed + k + int(dist),
                      [&](const void* w, const void* x, void* out, int m, bool pdl) {
                        if (w != made_for) {
                          const auto weight =
                              sd::TensorRef::contiguous(const_cast<void*>(w), sd::DType::bf16, {n, k}, 0);
                          sd::PoolerGemm::Options o;
                          o.force = ring;
                          on = std::make_unique<sd::PoolerGemm>(weight, 1, o);
                          o.enable_pdl = false;
                          off = std::make_unique<sd::PoolerGemm>(weight, 1, o);
                          made_for = w;
                        }
                        (pdl ? on : off)->run(x, out, m, nullptr);
                      });
        } catch (const std::exception& e) {
          ADD_FAILURE() << e.what();
        }
      }
  }
}

TEST(PoolerGemm, TableAndEveryEngineAtTheModelShape) {
  SKIP_WITHOUT_GPU(1);
  const uint64_t seed = test_seed("pooler gemm model shape");
  const int tp = 2, n = sd::kMuseSpark.pooled / tp, k = sd::kMuseSpark.hidden, M = sd::kMaxBatch;
  const auto w = normal_bf16(size_t(n) * k, seed, 0.05f);
  const auto x = normal_bf16(size_t(M) * k, seed + 1);
  DeviceBuffer dw(w.size() * 2), dx(x.size() * 2);
  dw.upload(w.data(), w.size() * 2);
  dx.upload(x.data(), x.size() * 2);
  GuardedBuffer out(size_t(M) * n * 2);
  const auto weight = sd::TensorRef::contiguous(dw.get(), sd::DType::bf16, {n, k}, 0);
  // Every engine through the PoolerGemm class, as the Pooler uses it: the
  // FP64 reference, PDL on equal to off, a second run equal to the first,
  // and each row the same in every batch (the batches share x's rows).
  for (const auto& f : table_and_candidates()) {
    sd::PoolerGemm::Options o;
    o.batches = servable(f, n, k, {1, 3, 8, 16});
    o.force = f;
    sd::PoolerGemm gemm(weight, tp, o);
    o.enable_pdl = false;
    sd::PoolerGemm gemm_off(weight, tp, o);
    auto run = [&](const sd::PoolerGemm& g, int m) {
      poison_bf16(out);
      g.run(dx.get(), out.get(), m, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(out.check_guards(), "");
      std::vector<uint16_t> got(size_t(M) * n);
      out.download(got.data(), got.size() * 2);
      for (size_t i = size_t(m) * n; i < got.size(); ++i) EXPECT_EQ(got[i], kPoisonBf16) << "written past m rows";
      got.resize(size_t(m) * n);
      return got;
    };
    const int most = o.batches.back();
    const auto full = run(gemm, most);
    EXPECT_EQ(std::count(full.begin(), full.end(), kPoisonBf16), 0) << gemm.choice(most).to_string();
    EXPECT_EQ(run(gemm, most), full) << gemm.choice(most).to_string() << ": a second run differs";
    for (int m : o.batches) {
      const auto got = run(gemm, m);
      const std::string what = gemm.choice(m).to_string() + " m " + std::to_string(m);
      EXPECT_EQ(check_gemm(got, x.data(), w.data(), m, n, k), "") << what;
      EXPECT_EQ(run(gemm_off, m), got) << what << ": PDL off differs from on";
      // Batch invariance holds per engine (docs/design.md, "Exact semantics"); the table may pick
      // different engines for different b, whose last bits differ.
      if (f || gemm.choice(m).to_string() == gemm.choice(most).to_string())
        EXPECT_TRUE(std::equal(got.begin(), got.end(), full.begin())) << what << ": rows differ from batch " << most;
    }
    EXPECT_THROW(gemm.run(dx.get(), out.get(), 2, nullptr), sd::InvalidArgument);  // not prepared
  }
}

// Each engine chained on its own output (x of call r + 1 is out of call r,
// written by the previous grid), PDL on against off: with PDL a GEMM starts
// before its predecessor ends, so reading x before griddepcontrol.wait
// would show here as different bits. A square [8192, 8192] weight scaled by
// 1/sqrt(K) keeps the values in range over the chain.
TEST(PoolerGemm, PdlChainEqualsPlainChain) {
  SKIP_WITHOUT_GPU(1);
  const uint64_t seed = test_seed("pooler gemm pdl chain");
  const int n = sd::kMuseSpark.hidden, k = n, M = sd::kMaxBatch, chain = 10;
  const auto w = normal_bf16(size_t(n) * k, seed, 0.011f);
  const auto x = normal_bf16(size_t(M) * k, seed + 1);
  DeviceBuffer dw(w.size() * 2), dx(x.size() * 2), links(size_t(M) * n * 2 * chain);
  dw.upload(w.data(), w.size() * 2);
  dx.upload(x.data(), x.size() * 2);
  const auto weight = sd::TensorRef::contiguous(dw.get(), sd::DType::bf16, {n, k}, 0);
  TestStream stream;
  auto link = [&](int r) { return links.as<uint16_t>() + size_t(M) * n * r; };
  for (const auto& f : table_and_candidates()) {
    sd::PoolerGemm::Options o;
    o.batches = servable(f, n, k, {1, 5, 16});
    o.force = f;
    sd::PoolerGemm on(weight, 1, o);
    o.enable_pdl = false;
    sd::PoolerGemm off(weight, 1, o);
    for (int m : o.batches) {
      std::vector<uint16_t> last[2];
      for (int pdl = 0; pdl < 2; ++pdl) {
        CUDA_CHECK(cudaMemsetAsync(links.get(), 0xff, links.bytes(), stream));  // ordered before the chain
        for (int r = 0; r < chain; ++r) (pdl ? on : off).run(r ? link(r - 1) : dx.get(), link(r), m, stream);
        CUDA_CHECK(cudaStreamSynchronize(stream));
        last[pdl] = download<uint16_t>(link(chain - 1), size_t(m) * n);
      }
      const std::string what = on.choice(m).to_string() + " m " + std::to_string(m);
      EXPECT_EQ(std::count(last[1].begin(), last[1].end(), kPoisonBf16), 0) << what;
      EXPECT_TRUE(last[0] == last[1]) << what << ": PDL on differs from off along the chain";
    }
  }
}
