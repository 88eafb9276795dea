/*
 * ppdlx classifier inference through the Paddle Inference C API (pd_inference_api.h).
 *
 *   ppdlx_infer MODEL_DIR [--backend cpu|gpu|trt] [--precision fp32|fp16|int8]
 *               [--batch-size N] [--size H W] [--layout NCHW|NHWC] [--input FILE.f32]
 *               [--threads N] [--gpu-id N] [--trt-max-batch N] [--trt-cache DIR]
 *               [--warmup W] [--repeats R]
 *
 * MODEL_DIR is a tools/export_model.py export: inference.json (PIR) or inference.pdmodel (legacy
 * program) + inference.pdiparams; the program file is chosen by which file exists, and --backend trt
 * needs the legacy one (model_select.h: the TensorRT subgraph engine skips PIR programs). --input is a
 * raw little-endian float32 tensor already pre-processed as inference.yml says (see README.md:
 * deploy/python/ppdlx_deploy can write one); without it a constant image is used (benchmarking).
 * Prints the engine that runs the network (onednn, cuda, paddle-trt-subgraph), the top-5 classes of
 * the first image and, with --repeats, latency mean/p50/p90/p95/p99 (true percentiles of per-batch
 * times, warm-up excluded) and throughput.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "model_select.h"
#include "pd_inference_api.h"

typedef struct {
  const char *model_dir, *backend, *precision, *layout, *input, *trt_cache;
  int batch, height, width, threads, gpu_id, trt_max_batch, warmup, repeats;
} Args;

static void die(const char *msg, const char *arg) {
  fprintf(stderr, "error: %s%s%s\n", msg, arg ? " " : "", arg ? arg : "");
  exit(2);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* numpy.percentile's default (linear interpolation between closest ranks) on sorted data */
static double percentile(const double *sorted, int n, double q) {
  double pos = (n - 1) * q / 100.0;
  int lo = (int)floor(pos), hi = (int)ceil(pos);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}

static Args parse(int argc, char **argv) {
  Args a = {NULL, "cpu", "fp32", "NCHW", NULL, NULL, 1, 224, 224, 1, 0, 0, 5, 0};
  if (argc < 2) die("usage: ppdlx_infer MODEL_DIR [options] (see infer.c)", NULL);
  a.model_dir = argv[1];
  for (int i = 2; i < argc; ++i) {
    const char *k = argv[i];
    if (i + 1 >= argc) die("missing value for", k);
    if (!strcmp(k, "--backend")) a.backend = argv[++i];
    else if (!strcmp(k, "--precision")) a.precision = argv[++i];
    else if (!strcmp(k, "--batch-size")) a.batch = atoi(argv[++i]);
    else if (!strcmp(k, "--size") && i + 2 < argc) { a.height = atoi(argv[++i]); a.width = atoi(argv[++i]); }
    else if (!strcmp(k, "--layout")) a.layout = argv[++i];
    else if (!strcmp(k, "--input")) a.input = argv[++i];
    else if (!strcmp(k, "--threads")) a.threads = atoi(argv[++i]);
    else if (!strcmp(k, "--gpu-id")) a.gpu_id = atoi(argv[++i]);
    else if (!strcmp(k, "--trt-max-batch")) a.trt_max_batch = atoi(argv[++i]);
    else if (!strcmp(k, "--trt-cache")) a.trt_cache = argv[++i];
    else if (!strcmp(k, "--warmup")) a.warmup = atoi(argv[++i]);
    else if (!strcmp(k, "--repeats")) a.repeats = atoi(argv[++i]);
    else die("unknown option", k);
  }
  if (a.batch < 1 || a.height < 1 || a.width < 1) die("batch size and image size must be >= 1", NULL);
  if (strcmp(a.layout, "NCHW") && strcmp(a.layout, "NHWC")) die("--layout must be NCHW or NHWC, got", a.layout);
  return a;
}

static PD_PrecisionType precision_of(const char *p) {
  if (!strcmp(p, "fp32")) return PD_PRECISION_FLOAT32;
  if (!strcmp(p, "fp16")) return PD_PRECISION_HALF;
  if (!strcmp(p, "int8")) return PD_PRECISION_INT8;
  die("--precision must be fp32, fp16 or int8, got", p);
  return PD_PRECISION_FLOAT32;
}

int main(int argc, char **argv) {
  Args a = parse(argc, argv);
  char cache[4096], why[1024];
  PD_PrecisionType precision = precision_of(a.precision);
  ProgramChoice choice;
  int refused = ppdlx_choose_program(a.model_dir, a.backend, a.precision, &choice, why, sizeof why);
  if (refused) {
    fprintf(stderr, "error: %s\n", why);
    return refused;
  }
  const char *prog = choice.prog;
  if (!strcmp(choice.engine, "paddle-trt-subgraph")) {
    char base[PPDLX_PATH_MAX], settings[256];
    int max_batch = a.trt_max_batch > a.batch ? a.trt_max_batch : a.batch;
    snprintf(base, sizeof base, "%s", a.trt_cache ? a.trt_cache : a.model_dir);
    snprintf(settings, sizeof settings, "max_batch=%d opt_batch=%d size=%dx%d layout=%s", max_batch, a.batch,
             a.height, a.width, a.layout);
    refused = ppdlx_engine_cache_dir(base, &choice, a.precision, settings, cache, sizeof cache, why, sizeof why);
    if (refused) {
      fprintf(stderr, "error: %s\n", why);
      return refused;
    }
  }
  printf("engine %s: %s\n", choice.engine, prog);

  /* ---- configuration: the same choices as build_plan() in deploy/python/ppdlx_deploy/plan.py */
  PD_Config *config = PD_ConfigCreate();
  PD_ConfigSetModel(config, prog, choice.params);
  PD_ConfigSwitchIrOptim(config, TRUE);
  int32_t shape[4];
  int32_t c_first = !strcmp(a.layout, "NCHW");
  if (!strcmp(a.backend, "cpu")) {
    if (precision != PD_PRECISION_FLOAT32) die("--backend cpu supports --precision fp32 in this program", NULL);
    PD_ConfigDisableGpu(config);
    PD_ConfigEnableMKLDNN(config); /* oneDNN */
    PD_ConfigSetCpuMathLibraryNumThreads(config, a.threads);
  } else if (!strcmp(a.backend, "gpu") || !strcmp(a.backend, "trt")) {
    /* 256 MB initial pool; GPU fp16 without TRT converts the program to mixed precision */
    PD_ConfigEnableUseGpu(config, 256, a.gpu_id,
                          !strcmp(a.backend, "gpu") ? precision : PD_PRECISION_FLOAT32);
    if (!strcmp(a.backend, "trt")) {
      int max_batch = a.trt_max_batch > a.batch ? a.trt_max_batch : a.batch;
      PD_ConfigSetOptimCacheDir(config, cache);              /* serialized engines live here */
      PD_ConfigEnableTensorRtEngine(config, (int64_t)1 << 30, /* workspace in BYTES (1 GiB) */
                                    max_batch, 3 /* min_subgraph_size */, precision,
                                    TRUE /* use_static: reuse engines */,
                                    FALSE /* use_calib_mode: int8 scales from a QAT export */);
      /* dynamic batch: min 1, opt = --batch-size, max = --trt-max-batch */
      const char *names[1] = {"image"};
      size_t dims[1] = {4};
      int32_t mn[4], mx[4], opt[4];
      int32_t hw_c[3] = {c_first ? 3 : a.height, c_first ? a.height : a.width, c_first ? a.width : 3};
      mn[0] = 1; mx[0] = max_batch; opt[0] = a.batch;
      for (int d = 0; d < 3; ++d) mn[d + 1] = mx[d + 1] = opt[d + 1] = hw_c[d];
      int32_t *mins[1] = {mn}, *maxs[1] = {mx}, *opts[1] = {opt};
      PD_ConfigSetTrtDynamicShapeInfo(config, 1, names, dims, mins, maxs, opts, FALSE);
    }
  }

  PD_Predictor *predictor = PD_PredictorCreate(config); /* takes ownership of config */
  if (!predictor) die("PD_PredictorCreate failed for", prog);

  /* ---- input */
  PD_OneDimArrayCstr *in_names = PD_PredictorGetInputNames(predictor);
  PD_OneDimArrayCstr *out_names = PD_PredictorGetOutputNames(predictor);
  if (in_names->size != 1) die("expected one input (a classification export)", NULL);
  PD_Tensor *input = PD_PredictorGetInputHandle(predictor, in_names->data[0]);
  PD_Tensor *output = PD_PredictorGetOutputHandle(predictor, out_names->data[0]);
  shape[0] = a.batch;
  shape[1] = c_first ? 3 : a.height;
  shape[2] = c_first ? a.height : a.width;
  shape[3] = c_first ? a.width : 3;
  size_t per_image = (size_t)3 * a.height * a.width, count = per_image * a.batch;
  float *data = (float *)malloc(count * sizeof(float));
  if (!data) die("out of memory", NULL);
  if (a.input) {
    FILE *f = fopen(a.input, "rb");
    if (!f) die("cannot open", a.input);
    size_t got = fread(data, sizeof(float), per_image, f);
    fclose(f);
    if (got != per_image) die("--input must hold one pre-processed float32 image:", a.input);
    for (int b = 1; b < a.batch; ++b) memcpy(data + b * per_image, data, per_image * sizeof(float));
  } else {
    for (size_t i = 0; i < count; ++i) data[i] = 0.5f;
  }

  /* ---- one run: top-5 of the first image */
  PD_TensorReshape(input, 4, shape);
  PD_TensorCopyFromCpuFloat(input, data);
  if (!PD_PredictorRun(predictor)) die("PD_PredictorRun failed", NULL);
  if (!strcmp(choice.engine, "paddle-trt-subgraph")) {
    int engines = ppdlx_count_files_with_prefix(cache, "trt_serialized_");
    if (!engines) {
      fprintf(stderr, "error: --backend trt: Paddle-TRT built no engine (no trt_serialized_* in %s after the first "
                      "run), so the model would run on plain CUDA; use --backend gpu for that\n", cache);
      return 3;
    }
    printf("engine %s: %d TensorRT engine(s) in %s\n", choice.engine, engines, cache);
  }
  PD_OneDimArrayInt32 *oshape = PD_TensorGetShape(output);
  size_t out_count = 1;
  for (size_t d = 0; d < oshape->size; ++d) out_count *= (size_t)oshape->data[d];
  int classes = oshape->size > 1 ? oshape->data[oshape->size - 1] : (int)out_count;
  float *out = (float *)malloc(out_count * sizeof(float));
  PD_TensorCopyToCpuFloat(output, out);
  printf("output %s: [", out_names->data[0]);
  for (size_t d = 0; d < oshape->size; ++d) printf("%s%d", d ? ", " : "", oshape->data[d]);
  printf("]\ntop-5 (raw output values of image 0):");
  for (int k = 0; k < 5 && k < classes; ++k) {
    int best = 0;
    for (int c = 1; c < classes; ++c)
      if (out[c] > out[best]) best = c;
    printf(" %d:%.4f", best, out[best]);
    out[best] = -INFINITY; /* exclude from the next round */
  }
  printf("\n");

  /* ---- benchmark */
  if (a.repeats > 0) {
    double *ms = (double *)malloc(sizeof(double) * a.repeats), total = 0;
    for (int i = 0; i < a.warmup + a.repeats; ++i) {
      double t0 = now_ms();
      PD_TensorReshape(input, 4, shape);
      PD_TensorCopyFromCpuFloat(input, data);
      PD_PredictorRun(predictor);
      PD_TensorCopyToCpuFloat(output, out);
      double dt = now_ms() - t0;
      if (i >= a.warmup) { ms[i - a.warmup] = dt; total += dt; }
    }
    qsort(ms, a.repeats, sizeof(double), cmp_double);
    double mean = total / a.repeats;
    printf("backend %s %s engine %s bs %d: %.2f img/s, latency ms mean %.3f p50 %.3f p90 %.3f p95 %.3f p99 %.3f\n",
           a.backend, a.precision, choice.engine, a.batch, a.batch * 1000.0 / mean, mean, percentile(ms, a.repeats, 50),
           percentile(ms, a.repeats, 90), percentile(ms, a.repeats, 95), percentile(ms, a.repeats, 99));
    free(ms);
  }

  free(out);
  free(data);
  PD_OneDimArrayInt32Destroy(oshape);
  PD_TensorDestroy(input);
  PD_TensorDestroy(output);
  PD_OneDimArrayCstrDestroy(in_names);
  PD_OneDimArrayCstrDestroy(out_names);
  PD_PredictorDestroy(predictor);
  return 0;
}
