/* exactjit from C, without a GPU: the library's version beside the header's, the options a runtime
 * resolved from the environment, and the error an offline runtime reports for a kernel its cache
 * lacks. Run it with EXACTJIT_OFFLINE=1 and an empty EXACTJIT_CACHE_DIR; it exits 0 when that
 * error is the offline miss. cxx_wrapper.cpp does the same through the C++ wrapper. */
#include <exactjit/exactjit.h>

#include <stdio.h>

/* A kernel in its canonical spec text (what `exactjit inspect --emit key` prints). */
static const char* const kSpec =
    "gate_residual dtype=bf16 hidden=5376 table_stride=32256 vec=8 index=int64 target=sm_90";

int main(void) {
  printf("exactjit %s (header %d.%d.%d)\n", xj_version(), XJ_VERSION_MAJOR, XJ_VERSION_MINOR, XJ_VERSION_PATCH);

  xj_runtime* runtime = NULL;
  if (xj_runtime_create(NULL, &runtime) != XJ_OK) { /* NULL: every option from the environment */
    fprintf(stderr, "xj_runtime_create: %s\n", xj_last_error());
    return 1;
  }
  printf("%s", xj_runtime_info(runtime));

  const exactjit_status_t status = xj_prewarm(runtime, kSpec);
  printf("prewarm: status %d: %s\n", (int)status, xj_last_error());
  xj_runtime_destroy(runtime);
  return status == XJ_ERROR_OFFLINE_MISS ? 0 : 1;
}
