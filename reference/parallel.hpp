// A small work-sharing loop over independent (sequence, head) lanes. Work items are claimed
// from an atomic counter; the first exception thrown by any worker is re-thrown to the caller.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace qed::reference {

// Number of worker threads: QEDCHECK_THREADS if set, otherwise the hardware concurrency.
inline int default_threads_impl() {
  if (const char* env = std::getenv("QEDCHECK_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : static_cast<int>(hc);
}
inline int default_threads() { return default_threads_impl(); }

template <class F>
void parallel_for(int64_t n, F&& f, int threads = 0) {
  if (n <= 0) return;
  if (threads <= 0) threads = default_threads();
  threads = static_cast<int>(std::min<int64_t>(threads, n));
  if (threads == 1) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    for (;;) {
      int64_t i = next.fetch_add(1);
      if (i >= n) return;
      try {
        f(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next.store(n);
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace qed::reference
