// gloo_allreduce: the Gloo peer of `cargo xtask bench --part loopback`.
//
// Gloo's chunked ring AllReduce (float32, sum, in place) over its TCP transport on loopback,
// with a file store for the rendezvous. One process per rank:
//   RANK=r SIZE=n STORE=DIR PREFIX=P gloo_allreduce -b MIN -e MAX -f FACTOR -n ITERS -w WARMUP
// Sizes are bytes with an optional K/M/G suffix (powers of 1024). For every size, rank 0 prints
//   R2B peer=gloo size=<bytes> count=<elems> iters=<n> time_us=<avg> algbw=<GB/s> busbw=<GB/s> wrong=<n>
// time is the slowest rank's average over ITERS back-to-back runs after WARMUP runs and a
// barrier; busbw = algbw * 2(n-1)/n (nccl-tests). The timed runs reduce in place (values grow by
// a power of two per run, so they stay exact until they overflow, which costs nothing on x86);
// after them the buffer is refilled with small integers and one more run is checked element by
// element (wrong = elements that differ, summed over ranks). Exit 1 if any element was wrong,
// 2 on bad arguments, 3 on a Gloo error (a timeout included: every operation has a deadline).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "gloo/allreduce_ring.h"
#include "gloo/allreduce_ring_chunked.h"
#include "gloo/barrier_all_to_all.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"

namespace {

long long parse_size(const char* s) {
  char* end = nullptr;
  long long v = std::strtoll(s, &end, 10);
  if (end == s || v < 0) return -1;
  if (*end == 'K' || *end == 'k') v <<= 10;
  else if (*end == 'M' || *end == 'm') v <<= 20;
  else if (*end == 'G' || *end == 'g') v <<= 30;
  else if (*end != '\0') return -1;
  return v;
}

// Element i of rank r's input: a small integer, so sums are exact.
float input_value(long long i, int rank) { return static_cast<float>((i * 7 + static_cast<long long>(rank) * 13) % 17); }

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

int usage() {
  std::fprintf(stderr,
               "usage: RANK=r SIZE=n STORE=DIR PREFIX=P gloo_allreduce [-b MIN] [-e MAX] [-f FACTOR>=2] "
               "[-n ITERS>=1] [-w WARMUP] [-t TIMEOUT_S]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  long long min_b = 4, max_b = 64LL << 20, factor = 2;
  int iters = 20, warmup = 5, timeout_s = 60;
  for (int a = 1; a < argc; a += 2) {
    if (a + 1 >= argc) return usage();
    const char* v = argv[a + 1];
    if (!std::strcmp(argv[a], "-b")) min_b = parse_size(v);
    else if (!std::strcmp(argv[a], "-e")) max_b = parse_size(v);
    else if (!std::strcmp(argv[a], "-f")) factor = std::atoll(v);
    else if (!std::strcmp(argv[a], "-n")) iters = std::atoi(v);
    else if (!std::strcmp(argv[a], "-w")) warmup = std::atoi(v);
    else if (!std::strcmp(argv[a], "-t")) timeout_s = std::atoi(v);
    else return usage();
  }
  const int rank = std::atoi(env("RANK"));
  const int world = std::atoi(env("SIZE"));
  if (min_b < 4 || max_b < min_b || factor < 2 || iters < 1 || warmup < 0 || timeout_s < 1 || world < 1 ||
      rank < 0 || rank >= world || !*env("STORE") || !*env("PREFIX")) {
    return usage();
  }
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    attr.ai_family = AF_INET;
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore file_store(env("STORE"));
    gloo::rendezvous::PrefixStore store(env("PREFIX"), file_store);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, world);
    context->setTimeout(std::chrono::seconds(timeout_s));
    context->connectFullMesh(store, dev);

    const long long max_count = max_b / 4;
    std::vector<float> data(static_cast<size_t>(max_count));
    long long total_wrong = 0;
    for (long long bytes = min_b; bytes <= max_b; bytes *= factor) {
      const int count = static_cast<int>(bytes / 4);
      for (long long i = 0; i < count; i++) data[i] = input_value(i, rank);
      std::vector<float*> ptrs{data.data()};
      gloo::AllreduceRingChunked<float> allreduce(context, ptrs, count);
      for (int w = 0; w < warmup; w++) allreduce.run();
      gloo::BarrierAllToAll(context).run();
      auto t0 = std::chrono::steady_clock::now();
      for (int it = 0; it < iters; it++) allreduce.run();
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
      // Verification run on fresh inputs.
      for (long long i = 0; i < count; i++) data[i] = input_value(i, rank);
      allreduce.run();
      double wrong = 0;
      for (long long i = 0; i < count; i++) {
        float want = 0;
        for (int r = 0; r < world; r++) want += input_value(i, r);
        if (data[i] != want) wrong += 1;
      }
      // The slowest rank's time and the wrong elements of all ranks, with Gloo itself.
      double slowest = secs;
      gloo::AllreduceRing<double>(context, {&slowest}, 1, gloo::ReductionFunction<double>::max).run();
      gloo::AllreduceRing<double>(context, {&wrong}, 1, gloo::ReductionFunction<double>::sum).run();
      if (rank == 0) {
        double algbw = static_cast<double>(count) * 4 / slowest / 1e9;
        std::printf("R2B peer=gloo size=%lld count=%d iters=%d time_us=%.3f algbw=%.6f busbw=%.6f wrong=%lld\n",
                    static_cast<long long>(count) * 4, count, iters, slowest * 1e6, algbw,
                    algbw * 2.0 * (world - 1) / world, static_cast<long long>(wrong));
        std::fflush(stdout);
      }
      total_wrong += static_cast<long long>(wrong);
      if (bytes > max_b / factor) break;
    }
    // No rank leaves before every rank is done: a rank that exits closes its pairs, and a rank
    // still finishing its last receive then fails with "Connection closed by peer" (rank 0 did,
    // once, at 64 MiB in `cargo xtask bench` on 2026-12-05).
    gloo::BarrierAllToAll(context).run();
    return rank == 0 && total_wrong != 0 ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_allreduce: rank %d: %s\n", rank, e.what());
    return 3;
  }
}
