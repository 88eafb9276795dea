/*
 * Which program file of a tools/export_model.py export runs for a backend, and which engine runs
 * it: the same decisions as deploy/python/infer.py (ppdlx_deploy/plan.py, trt.py), needing only libc.
 *
 * Paddle Inference routes a PIR program (inference.json) through its PIR pass pipeline, which has
 * no TensorRT step: PD_ConfigEnableTensorRtEngine would be ignored and the model would run on
 * plain CUDA. The C API has no PIR-TRT converter (that is Python's paddle.tensorrt), so --backend
 * trt takes the legacy program (inference.pdmodel) and refuses a PIR-only export in one line.
 */
#ifndef PPDLX_MODEL_SELECT_H
#define PPDLX_MODEL_SELECT_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PPDLX_PATH_MAX 4096

typedef struct {
  char prog[PPDLX_PATH_MAX], params[PPDLX_PATH_MAX];
  const char *engine; /* onednn | cuda | paddle-trt-subgraph */
  int quantized;      /* the program carries (fake) quantize ops: a QAT/PTQ export */
} ProgramChoice;

static int ppdlx_file_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static unsigned char *ppdlx_read_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *data = (unsigned char *)malloc(n > 0 ? (size_t)n : 1);
  *size = data && n > 0 ? fread(data, 1, (size_t)n, f) : 0;
  fclose(f);
  return data;
}

static int ppdlx_span_contains(const unsigned char *p, size_t n, const char *needle) {
  size_t len = strlen(needle);
  for (size_t i = 0; i + len <= n; ++i)
    if (!memcmp(p + i, needle, len)) return 1;
  return 0;
}

/* A protobuf span and its next field: returns 0 at the end or on malformed data; *value is the
 * payload of a length-delimited field (empty for the others, which are skipped). */
typedef struct { const unsigned char *p, *end; } PpdlxSpan;

static int ppdlx_pb_varint(PpdlxSpan *s, unsigned long long *v) {
  *v = 0;
  for (int shift = 0; s->p < s->end && shift < 64; shift += 7) {
    unsigned char b = *s->p++;
    *v |= (unsigned long long)(b & 0x7f) << shift;
    if (!(b & 0x80)) return 1;
  }
  return 0;
}

static int ppdlx_pb_next_typed(PpdlxSpan *s, unsigned *field, unsigned *wire, PpdlxSpan *value) {
  unsigned long long key, len;
  if (s->p >= s->end || !ppdlx_pb_varint(s, &key)) return 0;
  *field = (unsigned)(key >> 3);
  *wire = (unsigned)(key & 7);
  value->p = value->end = s->p;
  switch (key & 7) {
    case 0: return ppdlx_pb_varint(s, &len);
    case 1: if (s->end - s->p < 8) return 0; s->p += 8; return 1;
    case 5: if (s->end - s->p < 4) return 0; s->p += 4; return 1;
    case 2:
      if (!ppdlx_pb_varint(s, &len) || len > (unsigned long long)(s->end - s->p)) return 0;
      value->p = s->p;
      value->end = s->p += len;
      return 1;
    default: return 0;
  }
}

static int ppdlx_pb_next(PpdlxSpan *s, unsigned *field, PpdlxSpan *value) {
  unsigned wire;
  return ppdlx_pb_next_typed(s, field, &wire, value);
}

static int ppdlx_span_is(PpdlxSpan s, const char *str) {
  size_t len = strlen(str);
  return (size_t)(s.end - s.p) == len && !memcmp(s.p, str, len);
}

/* A QAT/PTQ export carries (fake) (de)quantize ops. A legacy .pdmodel is a ProgramDesc: the op
 * types are blocks(1) -> ops(4) -> type(3); its op_version_map lists every registered op, quantize
 * ops included, so the whole file cannot be searched. A PIR .json names ops "#":"<dialect>.<op>". */
static int ppdlx_is_quantized(const char *path) {
  size_t size = 0;
  unsigned char *data = ppdlx_read_file(path, &size);
  if (!data) return 0;
  int found = 0;
  size_t n = strlen(path);
  if (n >= 5 && !strcmp(path + n - 5, ".json")) {
    for (size_t i = 0; i + 6 < size && !found; ++i) {
      if (memcmp(data + i, "\"#\":\"", 5)) continue;
      size_t j = i + 5, k;
      while (j < size && data[j] >= '0' && data[j] <= '9') ++j;
      if (j == i + 5 || j >= size || data[j] != '.') continue;
      for (k = j + 1; k < size && data[k] != '"'; ++k) {}
      found = ppdlx_span_contains(data + j + 1, k - j - 1, "quantize");
    }
  } else {
    PpdlxSpan program = {data, data + size}, block, op, value;
    unsigned field;
    while (!found && ppdlx_pb_next(&program, &field, &block)) {
      if (field != 1) continue;
      while (!found && ppdlx_pb_next(&block, &field, &op)) {
        if (field != 4) continue;
        while (!found && ppdlx_pb_next(&op, &field, &value))
          found = field == 3 && ppdlx_span_contains(value.p, (size_t)(value.end - value.p), "quantize");
      }
    }
  }
  free(data);
  return found;
}

/* trt_support_nhwc_pass (paddle/fluid/framework/ir/trt_support_nhwc_pass.cc) turns an NHWC op to NCHW
 * only if it knows the op's weights; any other op marked NHWC (attribute data_format or data_layout)
 * whose inputs are all 4-D stops the pass with "op not supported" when the predictor is built. The
 * same lists as NHWC_PASS_SWITCHES and NHWC_PASS_LEAVES in deploy/python/ppdlx_deploy/trt.py. */
static const char *const PPDLX_NHWC_PASS_KNOWS[] = {
    "conv2d", "pool2d", "batch_norm", "bilinear_interp", "bilinear_interp_v2", "nearest_interp", "nearest_interp_v2",
    "prelu", "relu", "elementwise_add", "affine_channel", "softmax", "temporal_shift", NULL};

#define PPDLX_MAX_UNSWITCHABLE 16

typedef struct { PpdlxSpan name; int rank; } PpdlxVarRank;

/* VarDesc type(2) -> VarType dense_tensor(3) -> DenseTensorDesc tensor(1) -> TensorDesc dims(2),
 * packed or not; -1 for a variable that is not a dense tensor. */
static int ppdlx_var_rank(PpdlxSpan var) {
  PpdlxSpan type, dense, tensor, value;
  unsigned field, wire;
  while (ppdlx_pb_next(&var, &field, &type)) {
    if (field != 2) continue;
    while (ppdlx_pb_next(&type, &field, &dense)) {
      if (field != 3) continue;
      while (ppdlx_pb_next(&dense, &field, &tensor)) {
        if (field != 1) continue;
        int rank = 0;
        while (ppdlx_pb_next_typed(&tensor, &field, &wire, &value)) {
          if (field != 2) continue;
          if (wire == 0) { ++rank; continue; }
          unsigned long long dim;
          while (value.p < value.end && ppdlx_pb_varint(&value, &dim)) ++rank;
        }
        return rank;
      }
    }
  }
  return -1;
}

static int ppdlx_rank_of(const PpdlxVarRank *vars, size_t n, PpdlxSpan name) {
  for (size_t i = 0; i < n; ++i)
    if (vars[i].name.end - vars[i].name.p == name.end - name.p &&
        !memcmp(vars[i].name.p, name.p, (size_t)(name.end - name.p)))
      return vars[i].rank;
  return -1;
}

/* Whether an OpDesc is one trt_support_nhwc_pass stops on; its type goes to *type. */
static int ppdlx_op_stops_nhwc_pass(PpdlxSpan op, const PpdlxVarRank *vars, size_t n_vars, PpdlxSpan *type) {
  PpdlxSpan value, part, inner, data_format = {NULL, NULL}, data_layout = {NULL, NULL};
  unsigned field;
  int inputs_4d = 1;
  type->p = type->end = NULL;
  for (PpdlxSpan s = op; ppdlx_pb_next(&s, &field, &value);) {
    if (field == 3) {
      *type = value;
    } else if (field == 4) { /* Attr: name(1), s(5) */
      PpdlxSpan name = {NULL, NULL}, str = {NULL, NULL};
      for (part = value; ppdlx_pb_next(&part, &field, &inner);) {
        if (field == 1) name = inner;
        else if (field == 5) str = inner;
      }
      if (name.p && ppdlx_span_is(name, "data_format")) data_format = str;
      else if (name.p && ppdlx_span_is(name, "data_layout")) data_layout = str;
    } else if (field == 1) { /* inputs: Var parameter(1), arguments(2) */
      for (part = value; ppdlx_pb_next(&part, &field, &inner);)
        if (field == 2 && ppdlx_rank_of(vars, n_vars, inner) != 4) inputs_4d = 0;
    }
  }
  PpdlxSpan layout = data_format.p ? data_format : data_layout; /* data_format wins, as in the pass */
  if (!layout.p || !ppdlx_span_is(layout, "NHWC") || !inputs_4d || !type->p) return 0;
  for (const char *const *known = PPDLX_NHWC_PASS_KNOWS; *known; ++known)
    if (ppdlx_span_is(*type, *known)) return 0;
  return 1;
}

static int ppdlx_compare_names(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The sorted, comma-separated op types of a legacy program that trt_support_nhwc_pass stops on
 * (empty when none): ProgramDesc blocks(1) -> vars(3) and ops(4). Returns 0 if the file cannot be read. */
static int ppdlx_nhwc_ops_the_pass_cannot_switch(const char *path, char *out, size_t out_size) {
  size_t size = 0;
  unsigned char *data = ppdlx_read_file(path, &size);
  out[0] = '\0';
  if (!data) return 0;
  char found[PPDLX_MAX_UNSWITCHABLE][64];
  const char *names[PPDLX_MAX_UNSWITCHABLE];
  size_t n_found = 0;
  PpdlxSpan program = {data, data + size}, block, value, type;
  unsigned field;
  while (ppdlx_pb_next(&program, &field, &block)) {
    if (field != 1) continue;
    size_t n_vars = 0, cap = 0;
    PpdlxVarRank *vars = NULL;
    for (PpdlxSpan s = block; ppdlx_pb_next(&s, &field, &value);) {
      if (field != 3) continue;
      if (n_vars == cap) {
        PpdlxVarRank *grown = (PpdlxVarRank *)realloc(vars, (cap = cap ? 2 * cap : 64) * sizeof *vars);
        if (!grown) break;
        vars = grown;
      }
      PpdlxSpan var = value, name = {NULL, NULL}, part;
      while (ppdlx_pb_next(&var, &field, &part))
        if (field == 1) name = part;
      vars[n_vars].name = name;
      vars[n_vars++].rank = ppdlx_var_rank(value);
    }
    for (PpdlxSpan s = block; ppdlx_pb_next(&s, &field, &value);) {
      if (field != 4 || !ppdlx_op_stops_nhwc_pass(value, vars, n_vars, &type)) continue;
      char name[64];
      snprintf(name, sizeof name, "%.*s", (int)(type.end - type.p), (const char *)type.p);
      size_t i = 0;
      while (i < n_found && strcmp(found[i], name)) ++i;
      if (i == n_found && n_found < PPDLX_MAX_UNSWITCHABLE) memcpy(found[n_found++], name, sizeof name);
    }
    free(vars);
  }
  free(data);
  for (size_t i = 0; i < n_found; ++i) names[i] = found[i];
  qsort(names, n_found, sizeof *names, ppdlx_compare_names);
  for (size_t i = 0, used = 0; i < n_found && used < out_size; ++i)
    used += (size_t)snprintf(out + used, out_size - used, "%s%s", i ? ", " : "", names[i]);
  return 1;
}

/* Fills *out, or returns an exit code (2: missing/ambiguous files, 3: a combination that would not
 * run as asked) with a one-line message in err. */
static int ppdlx_choose_program(const char *model_dir, const char *backend, const char *precision,
                                ProgramChoice *out, char *err, size_t err_size) {
  char json[PPDLX_PATH_MAX], pdmodel[PPDLX_PATH_MAX];
  snprintf(json, sizeof json, "%s/inference.json", model_dir);          /* Paddle 3 PIR program */
  snprintf(pdmodel, sizeof pdmodel, "%s/inference.pdmodel", model_dir); /* legacy ProgramDesc */
  snprintf(out->params, sizeof out->params, "%s/inference.pdiparams", model_dir);
  int has_json = ppdlx_file_exists(json), has_pdmodel = ppdlx_file_exists(pdmodel);
  if (!has_json && !has_pdmodel) {
    snprintf(err, err_size, "%s: neither inference.json nor inference.pdmodel exists", model_dir);
    return 2;
  }
  if (has_json && has_pdmodel) {
    snprintf(err, err_size, "%s: both inference.json and inference.pdmodel exist; remove the stale one", model_dir);
    return 2;
  }
  if (!ppdlx_file_exists(out->params)) {
    snprintf(err, err_size, "%s: inference.pdiparams is missing", model_dir);
    return 2;
  }
  snprintf(out->prog, sizeof out->prog, "%s", has_json ? json : pdmodel);
  out->quantized = ppdlx_is_quantized(out->prog);
  if (!strcmp(backend, "cpu")) {
    out->engine = "onednn";
  } else if (!strcmp(backend, "gpu")) {
    if (!strcmp(precision, "int8")) {
      snprintf(err, err_size, "--backend gpu --precision int8: int8 on GPU runs through TensorRT; use --backend trt");
      return 3;
    }
    out->engine = "cuda";
  } else if (!strcmp(backend, "trt")) {
    if (has_json) {
      snprintf(err, err_size,
               "--backend trt: inference.json is a PIR program, which Paddle Inference's TensorRT subgraph engine "
               "(PD_ConfigEnableTensorRtEngine) skips, and the C API has no PIR-TRT converter; re-export with "
               "tools/export_model.py --format program, or run deploy/python/infer.py --backend trt (paddle.tensorrt)");
      return 3;
    }
    if (!strcmp(precision, "int8") && !out->quantized) {
      snprintf(err, err_size,
               "--backend trt --precision int8: inference.pdmodel has no quantize ops and this program does not "
               "calibrate; export a QAT/PTQ model, or calibrate with deploy/python/infer.py --calib-dir");
      return 3;
    }
    char unswitchable[512];
    if (ppdlx_nhwc_ops_the_pass_cannot_switch(out->prog, unswitchable, sizeof unswitchable) && unswitchable[0]) {
      snprintf(err, err_size,
               "--backend trt: inference.pdmodel is an NHWC program with %s ops, which Paddle-TRT's "
               "trt_support_nhwc_pass cannot turn to NCHW (it stops building the predictor); re-export with "
               "-o export.data_format=NCHW (the same weights)", unswitchable);
      return 3;
    }
    out->engine = "paddle-trt-subgraph";
  } else {
    snprintf(err, err_size, "--backend must be cpu, gpu or trt, got %s", backend);
    return 2;
  }
  return 0;
}

static uint64_t ppdlx_fnv1a(const unsigned char *p, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}

/* mkdir -p: 0 when path is a folder afterwards. */
static int ppdlx_make_dirs(const char *path) {
  char partial[PPDLX_PATH_MAX];
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof partial) return -1;
  memcpy(partial, path, n + 1);
  for (size_t i = 1; i <= n; ++i) {
    if (partial[i] != '/' && partial[i] != '\0') continue;
    char kept = partial[i];
    partial[i] = '\0';
    struct stat st;
    if (stat(partial, &st) != 0 && mkdir(partial, 0755) != 0) return -1;
    partial[i] = kept;
  }
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : -1;
}

/* The folder for this program's TensorRT engines under base, created with its parents (Paddle's
 * PD_ConfigSetOptimCacheDir folder gets a single mkdir, which fails without its parent): one per
 * model content and engine settings. Paddle names a serialised engine after its subgraph's variable
 * names only, so in a shared folder a retrained model of the same architecture would load the old
 * engine, weights included. Returns 0, or 2 with a message in err when a model file cannot be read
 * or the folder cannot be made. */
static int ppdlx_engine_cache_dir(const char *base, const ProgramChoice *c, const char *precision,
                                  const char *settings, char *out, size_t out_size, char *err, size_t err_size) {
  uint64_t h = 14695981039346656037ULL;
  const char *files[2] = {c->prog, c->params};
  for (int i = 0; i < 2; ++i) {
    size_t size = 0;
    unsigned char *data = ppdlx_read_file(files[i], &size);
    if (!data) {
      snprintf(err, err_size, "%s: cannot be read", files[i]);
      return 2;
    }
    h = ppdlx_fnv1a(data, size, ppdlx_fnv1a((const unsigned char *)"|", 1, h));
    free(data);
  }
  h = ppdlx_fnv1a((const unsigned char *)precision, strlen(precision), h);
  h = ppdlx_fnv1a((const unsigned char *)settings, strlen(settings), h);
  snprintf(out, out_size, "%s/subgraph_%s_%016llx", base, precision, (unsigned long long)h);
  if (ppdlx_make_dirs(out) != 0) {
    snprintf(err, err_size, "--trt-cache %s: cannot create %s; give a writable --trt-cache DIR", base, out);
    return 2;
  }
  return 0;
}

/* Files in dir whose name starts with prefix: after the first TRT run, the serialised engines
 * (use_static) are <cache>/trt_serialized_<key>; none means TensorRT took no subgraph. */
static int ppdlx_count_files_with_prefix(const char *dir, const char *prefix) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int count = 0;
  for (struct dirent *e = readdir(d); e; e = readdir(d)) count += !strncmp(e->d_name, prefix, strlen(prefix));
  closedir(d);
  return count;
}

#endif /* PPDLX_MODEL_SELECT_H */
