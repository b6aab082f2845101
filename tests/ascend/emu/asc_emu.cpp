// The emulator's state and launch guard (see asc_emu.h), compiled into every emulated kernel.
#include "asc_emu.h"

#include <stdexcept>
#include <string>

thread_local asc_emu_index threadIdx;
int32_t block_idx;
uint8_t *asc_emu_ub;
int64_t asc_emu_ub_bytes;
thread_local std::barrier<> *asc_emu_barrier;

static std::vector<int64_t> accesses;  // kind, address, bytes: three words a copy
static std::string error;

void asc_emu_record(char kind, const void *lo, int64_t bytes) {
  accesses.insert(accesses.end(), {int64_t(kind), int64_t(reinterpret_cast<intptr_t>(lo)), bytes});
}

void asc_emu_fail(const char *what, long a, long b) {
  throw std::runtime_error(std::string(what) + " (" + std::to_string(a) + ", " + std::to_string(b) + ")");
}

int asc_emu_guard(int32_t blocks, void (*launch)(const uint64_t *), const uint64_t *words) {
  std::vector<uint8_t> ub(asc_emu_ub_bytes + 64);
  accesses.clear();
  error.clear();
  try {
    for (block_idx = 0; block_idx < blocks; ++block_idx) {
      std::memset(ub.data(), 0xff, ub.size());
      asc_emu_ub = ub.data();
      launch(words);
    }
  } catch (const std::exception &e) {
    error = "block " + std::to_string(block_idx) + ": " + e.what();
    return 1;
  }
  return 0;
}

extern "C" void asc_emu_set_ub_bytes(int64_t bytes) { asc_emu_ub_bytes = bytes; }
extern "C" const char *asc_emu_error() { return error.c_str(); }
extern "C" int64_t asc_emu_access_words() { return int64_t(accesses.size()); }
extern "C" const int64_t *asc_emu_accesses() { return accesses.data(); }
