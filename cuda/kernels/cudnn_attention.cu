// Causal attention through cuDNN's fused SDPA engines, built as backend
// operation graphs (docs/cudnn-attention.md has the graphs node by node).
// cuDNN is loaded with dlopen; only its headers are used at build time.
#include "cuda/kernels/cudnn_attention.h"

#include <cudnn_graph.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <float.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

typedef cudnnBackendDescriptor_t desc_t;

#define MAX_PLANS 64
#define WS_ALIGN 256

// Unique ids of the tensors the caller (or this file) supplies at execution.
enum {
    UID_Q = 1,
    UID_K,
    UID_V,
    UID_O,
    UID_STATS,
    UID_DO,
    UID_DQ,
    UID_DK,
    UID_DV,
    UID_SCALE,      // by value: the softmax scale
    UID_NEG,        // by value: the masked score (-FLT_MAX)
    UID_ONE,        // by value: 1.0 (the backward's dropout-scale slot)
    UID_SOFTMAX_SUM, // workspace: rowsum(dO * O), fp32 (B, H, S, 1)
    UID_DQ_ACCUM,   // workspace: fp32 dQ accumulator (non-deterministic backward only)
    UID_VIRTUAL = 100,
};

struct plan_entry {
    int key[7]; // backward?, B, S, H, Hkv, D, deterministic
    desc_t plan;
    size_t engine_ws;             // the plan's own workspace
    size_t total_ws;              // engine_ws plus our workspace tensors, aligned
    size_t off_sum, off_dq_accum; // offsets of the workspace tensors (backward)
    std::vector<desc_t> owned;    // every descriptor of the graph, freed with the entry
};

struct mt_cudnn_attn {
    void *lib;
    cudnnHandle_t handle;
    size_t version;
    int deterministic;
    pthread_mutex_t mu;
    decltype(&cudnnGetVersion) get_version;
    decltype(&cudnnCreate) create;
    decltype(&cudnnDestroy) destroy;
    decltype(&cudnnSetStream) set_stream;
    decltype(&cudnnGetErrorString) err_string;
    decltype(&cudnnGetLastErrorString) last_error;
    decltype(&cudnnBackendCreateDescriptor) bcreate;
    decltype(&cudnnBackendDestroyDescriptor) bdestroy;
    decltype(&cudnnBackendSetAttribute) bset;
    decltype(&cudnnBackendGetAttribute) bget;
    decltype(&cudnnBackendFinalize) bfinalize;
    decltype(&cudnnBackendExecute) bexecute;
    plan_entry *plans[MAX_PLANS];
    int n_plans, next_evict;
};

static void sayf(char *why, size_t len, const char *fmt, ...)
{
    if (!why || !len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
}

static void no_last_error(char *message, size_t max_size)
{
    if (message && max_size) message[0] = '\0';
}

// Loads the library and resolves the entry points; no handle yet.
static mt_cudnn_attn *load(char *why, size_t why_len)
{
    const char *names[] = {"libcudnn.so.9", "/usr/local/cuda/lib64/libcudnn.so.9"};
    void *lib = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !lib; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        sayf(why, why_len, "cannot load libcudnn.so.9: %s", dlerror());
        return NULL;
    }
    mt_cudnn_attn *a = (mt_cudnn_attn *)calloc(1, sizeof *a);
    if (!a) {
        dlclose(lib);
        sayf(why, why_len, "out of host memory");
        return NULL;
    }
    a->lib = lib;
    pthread_mutex_init(&a->mu, NULL);
#define LOAD(field, sym)                                                                                               \
    if (!(*(void **)&a->field = dlsym(lib, #sym))) {                                                                  \
        sayf(why, why_len, "libcudnn.so.9 lacks %s", #sym);                                                            \
        mt_cudnn_attn_destroy(a);                                                                                      \
        return NULL;                                                                                                   \
    }
    LOAD(get_version, cudnnGetVersion)
    LOAD(create, cudnnCreate)
    LOAD(destroy, cudnnDestroy)
    LOAD(set_stream, cudnnSetStream)
    LOAD(err_string, cudnnGetErrorString)
    LOAD(bcreate, cudnnBackendCreateDescriptor)
    LOAD(bdestroy, cudnnBackendDestroyDescriptor)
    LOAD(bset, cudnnBackendSetAttribute)
    LOAD(bget, cudnnBackendGetAttribute)
    LOAD(bfinalize, cudnnBackendFinalize)
    LOAD(bexecute, cudnnBackendExecute)
#undef LOAD
    // optional: only the messages need it
    *(void **)&a->last_error = dlsym(lib, "cudnnGetLastErrorString");
    if (!a->last_error) a->last_error = no_last_error;
    a->version = a->get_version();
    if (a->version < 90000) {
        sayf(why, why_len, "cuDNN %zu is older than 9.0", a->version);
        mt_cudnn_attn_destroy(a);
        return NULL;
    }
    return a;
}

extern "C" mt_cudnn_attn *mt_cudnn_attn_create(int deterministic, char *why, size_t why_len)
{
    mt_cudnn_attn *a = load(why, why_len);
    if (!a) return NULL;
    cudnnStatus_t s = a->create(&a->handle);
    if (s != CUDNN_STATUS_SUCCESS) {
        a->handle = NULL;
        sayf(why, why_len, "cudnnCreate failed: %s", a->err_string(s));
        mt_cudnn_attn_destroy(a);
        return NULL;
    }
    a->deterministic = deterministic != 0;
    return a;
}

extern "C" size_t mt_cudnn_attn_probe(char *why, size_t why_len)
{
    mt_cudnn_attn *a = load(why, why_len);
    const size_t v = a ? a->version : 0;
    mt_cudnn_attn_destroy(a);
    return v;
}

extern "C" int mt_cudnn_attn_shape_ok(size_t version, int bwd, int S, int H, int Hkv, int D, char *why,
                                      size_t why_len)
{
    if (version >= 91000 && version < 91002) {
        sayf(why, why_len, "cuDNN %zu's fused attention forward is known to be wrong (9.10.0 and 9.10.1)", version);
        return MT_CUDNN_EUNSUPPORTED;
    }
    if (D % 8 != 0 || D > 256 || D <= 0) {
        sayf(why, why_len, "head size %d: cuDNN takes multiples of 8 up to 256", D);
        return MT_CUDNN_EUNSUPPORTED;
    }
    if (H <= 0 || Hkv <= 0 || H % Hkv) {
        sayf(why, why_len, "%d query heads do not group over %d key/value heads", H, Hkv);
        return MT_CUDNN_EUNSUPPORTED;
    }
    if (bwd && version < 91600 && S % 128 != 0) {
        // Older backward engines need an explicit padding mask (sequence
        // length tensors) when S is not a multiple of 128; not built here.
        sayf(why, why_len, "cuDNN %zu backward needs S %% 128 == 0 without a padding mask (S = %d)", version, S);
        return MT_CUDNN_EUNSUPPORTED;
    }
    return 0;
}

// Slack for the engines' own small buffers (tile counters, semaphores).
#define WS_SLACK ((size_t)16 << 20)

extern "C" size_t mt_cudnn_attn_forward_workspace_bound(int B, int S, int H, int Hkv, int D)
{
    (void)B, (void)S, (void)H, (void)Hkv, (void)D;
    return WS_SLACK;
}

extern "C" size_t mt_cudnn_attn_backward_workspace_bound(int B, int S, int H, int Hkv, int D, int deterministic)
{
    (void)Hkv;
    const size_t bh = (size_t)B * H, s128 = ((size_t)S + 127) / 128 * 128;
    // softmax_sum (ours) and an fp32 dQ: dQ_accum (ours, non-deterministic)
    // or the engine's own (deterministic); the deterministic engine also keeps
    // dS for the ordered dQ pass, (B, H, S, S) bf16
    size_t n = WS_SLACK + bh * s128 * sizeof(float) + bh * s128 * (size_t)D * sizeof(float);
    if (deterministic) n += bh * s128 * s128 * 2;
    return n;
}

static void free_entry(mt_cudnn_attn *a, plan_entry *e)
{
    if (!e) return;
    if (e->plan) a->bdestroy(e->plan);
    for (size_t i = e->owned.size(); i-- > 0;) a->bdestroy(e->owned[i]);
    delete e;
}

extern "C" void mt_cudnn_attn_destroy(mt_cudnn_attn *a)
{
    if (!a) return;
    for (int i = 0; i < a->n_plans; i++) free_entry(a, a->plans[i]);
    if (a->handle) a->destroy(a->handle);
    pthread_mutex_destroy(&a->mu);
    if (a->lib) dlclose(a->lib);
    free(a);
}

extern "C" size_t mt_cudnn_attn_version(const mt_cudnn_attn *a) { return a ? a->version : 0; }
extern "C" int mt_cudnn_attn_deterministic(const mt_cudnn_attn *a) { return a ? a->deterministic : 0; }

// ---- graph building ---------------------------------------------------------------

// Descriptors built for one graph; the first failure is recorded and every
// later call is a no-op, so the building code reads straight through.
struct builder {
    mt_cudnn_attn *a;
    std::vector<desc_t> owned, ops;
    int64_t next_uid = UID_VIRTUAL;
    bool failed = false;
    char msg[512] = {0};

    void fail(const char *what, cudnnStatus_t s)
    {
        if (failed) return;
        failed = true;
        char last[256] = {0};
        a->last_error(last, sizeof last);
        snprintf(msg, sizeof msg, "%s: %s%s%s", what, a->err_string(s), last[0] ? ": " : "", last);
    }
    desc_t make(cudnnBackendDescriptorType_t t, const char *what)
    {
        if (failed) return NULL;
        desc_t d = NULL;
        cudnnStatus_t s = a->bcreate(t, &d);
        if (s != CUDNN_STATUS_SUCCESS) {
            fail(what, s);
            return NULL;
        }
        owned.push_back(d);
        return d;
    }
    void set(desc_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t n, const void *v,
             const char *what)
    {
        if (failed) return;
        cudnnStatus_t s = a->bset(d, name, type, n, v);
        if (s != CUDNN_STATUS_SUCCESS) fail(what, s);
    }
    void finalize(desc_t d, const char *what)
    {
        if (failed) return;
        cudnnStatus_t s = a->bfinalize(d);
        if (s != CUDNN_STATUS_SUCCESS) fail(what, s);
    }

    // A 4-d tensor. uid 0 takes the next virtual id.
    desc_t tensor(cudnnDataType_t dt, const int64_t dim[4], const int64_t stride[4], bool is_virtual,
                  int64_t uid = 0, bool by_value = false)
    {
        desc_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor descriptor");
        if (!uid) uid = next_uid++;
        const int64_t align = 16;
        const bool v = is_virtual, bv = by_value;
        set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor data type");
        set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim, "tensor dimensions");
        set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride, "tensor strides");
        set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
        set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
        set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v, "tensor is_virtual");
        if (bv) set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &bv, "tensor is_by_value");
        finalize(t, "tensor");
        return t;
    }
    // A virtual tensor of dims d0..d3, packed row-major.
    desc_t vt(cudnnDataType_t dt, int64_t d0, int64_t d1, int64_t d2, int64_t d3)
    {
        const int64_t dim[4] = {d0, d1, d2, d3}, stride[4] = {d1 * d2 * d3, d2 * d3, d3, 1};
        return tensor(dt, dim, stride, true);
    }
    desc_t scalar(int64_t uid)
    {
        const int64_t one[4] = {1, 1, 1, 1};
        return tensor(CUDNN_DATA_FLOAT, one, one, false, uid, true);
    }

    void add_op(desc_t op, const char *what)
    {
        finalize(op, what);
        if (!failed) ops.push_back(op);
    }
    // y = mode(x[, b[, t]]); axis >= 0 for GEN_INDEX.
    void pointwise(cudnnPointwiseMode_t mode, desc_t x, desc_t b, desc_t t, desc_t y,
                   cudnnDataType_t compute = CUDNN_DATA_FLOAT, int64_t axis = -1)
    {
        desc_t pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise descriptor");
        set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
        set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &compute, "pointwise precision");
        if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
        finalize(pw, "pointwise descriptor");
        desc_t op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise operation");
        set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw, "pointwise op");
        set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "pointwise x");
        if (b) set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, "pointwise b");
        if (t) set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, "pointwise t");
        set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "pointwise y");
        add_op(op, "pointwise operation");
    }
    void matmul(desc_t A, desc_t Bm, desc_t C)
    {
        cudnnDataType_t comp = CUDNN_DATA_FLOAT;
        desc_t mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul descriptor");
        set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "matmul compute type");
        finalize(mm, "matmul descriptor");
        desc_t op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation");
        set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &A, "matmul a");
        set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &Bm, "matmul b");
        set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &C, "matmul c");
        set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm, "matmul desc");
        add_op(op, "matmul operation");
    }
    void reduction(cudnnReduceTensorOp_t mode, desc_t x, desc_t y)
    {
        cudnnDataType_t comp = CUDNN_DATA_FLOAT;
        desc_t rd = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction descriptor");
        set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, "reduction operator");
        set(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "reduction compute type");
        finalize(rd, "reduction descriptor");
        desc_t op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction operation");
        set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "reduction x");
        set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "reduction y");
        set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd, "reduction desc");
        add_op(op, "reduction operation");
    }
    void reshape(desc_t x, desc_t y)
    {
        desc_t op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape operation");
        set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "reshape x");
        set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "reshape y");
        add_op(op, "reshape operation");
    }
    // Keeps the score where row >= column (causal, top-left aligned), else
    // the by-value NEG scalar.
    desc_t causal_mask(desc_t s, int64_t B, int64_t H, int64_t S, desc_t neg)
    {
        desc_t row = vt(CUDNN_DATA_INT32, B, H, S, S), col = vt(CUDNN_DATA_INT32, B, H, S, S);
        pointwise(CUDNN_POINTWISE_GEN_INDEX, s, NULL, NULL, row, CUDNN_DATA_INT32, 2);
        pointwise(CUDNN_POINTWISE_GEN_INDEX, s, NULL, NULL, col, CUDNN_DATA_INT32, 3);
        desc_t keep = vt(CUDNN_DATA_BOOLEAN, B, H, S, S);
        pointwise(CUDNN_POINTWISE_CMP_GE, row, col, NULL, keep, CUDNN_DATA_BOOLEAN);
        desc_t out = vt(CUDNN_DATA_FLOAT, B, H, S, S);
        pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, neg, keep, out);
        return out;
    }
};

// Layouts of the caller's tensors as the 4-d (batch, head, row, column) views
// cuDNN takes. q-like: (B, S, H, D) storage seen as (B, H, S, D).
static void q_layout(int64_t B, int64_t S, int64_t H, int64_t D, int64_t dim[4], int64_t stride[4])
{
    (void)B;
    dim[0] = B, dim[1] = H, dim[2] = S, dim[3] = D;
    stride[0] = S * H * D, stride[1] = D, stride[2] = H * D, stride[3] = 1;
}
// The transpose of a kv-like tensor: (B, S, Hkv, D) storage seen as (B, Hkv, D, S).
static void kt_layout(int64_t B, int64_t S, int64_t Hkv, int64_t D, int64_t dim[4], int64_t stride[4])
{
    dim[0] = B, dim[1] = Hkv, dim[2] = D, dim[3] = S;
    stride[0] = S * Hkv * D, stride[1] = D, stride[2] = 1, stride[3] = Hkv * D;
}

// Forward graph: S = Q K^T, scale, causal mask, softmax with stats, O = P V.
static void build_forward(builder &g, int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D)
{
    int64_t dim[4], str[4];
    q_layout(B, S, H, D, dim, str);
    desc_t q = g.tensor(CUDNN_DATA_BFLOAT16, dim, str, false, UID_Q);
    desc_t o = g.tensor(CUDNN_DATA_BFLOAT16, dim, str, false, UID_O);
    kt_layout(B, S, Hkv, D, dim, str);
    desc_t kt = g.tensor(CUDNN_DATA_BFLOAT16, dim, str, false, UID_K);
    q_layout(B, S, Hkv, D, dim, str);
    desc_t v = g.tensor(CUDNN_DATA_BFLOAT16, dim, str, false, UID_V);
    const int64_t sdim[4] = {B, H, S, 1}, sstr[4] = {H * S, S, 1, 1};
    desc_t stats = g.tensor(CUDNN_DATA_FLOAT, sdim, sstr, false, UID_STATS);
    desc_t scale = g.scalar(UID_SCALE), neg = g.scalar(UID_NEG);

    desc_t s0 = g.vt(CUDNN_DATA_FLOAT, B, H, S, S);
    g.matmul(q, kt, s0);
    desc_t s1 = g.vt(CUDNN_DATA_FLOAT, B, H, S, S);
    g.pointwise(CUDNN_POINTWISE_MUL, s0, scale, NULL, s1);
    desc_t s2 = g.causal_mask(s1, B, H, S, neg);
    desc_t mx = g.vt(CUDNN_DATA_FLOAT, B, H, S, 1);
    g.reduction(CUDNN_REDUCE_TENSOR_MAX, s2, mx);
    desc_t s3 = g.vt(CUDNN_DATA_FLOAT, B, H, S, S);
    g.pointwise(CUDNN_POINTWISE_SUB, s2, mx, NULL, s3);
    desc_t e = g.vt(CUDNN_DATA_FLOAT, B, H, S, S);
    g.pointwise(CUDNN_POINTWISE_EXP, s3, NULL, NULL, e);
    desc_t z = g.vt(CUDNN_DATA_FLOAT, B, H, S, 1);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);
    desc_t lz = g.vt(CUDNN_DATA_FLOAT, B, H, S, 1);
    g.pointwise(CUDNN_POINTWISE_LOG, z, NULL, NULL, lz);
    g.pointwise(CUDNN_POINTWISE_ADD, mx, lz, NULL, stats);
    desc_t p = g.vt(CUDNN_DATA_BFLOAT16, B, H, S, S); // P enters the second product in the i/o type
    g.pointwise(CUDNN_POINTWISE_DIV, e, z, NULL, p);
    g.matmul(p, v, o);
}

// Backward graph (see the design note): softmax_sum = rowsum(dO * O), the
// probabilities recomputed from Q K^T and the stats, dV = P^T dO,
// dS = P (dP - softmax_sum) * scale with dP = dO V^T, dK = dS^T Q, dQ = dS K.
// Grouped heads: dV and dK are formed per query head and summed over each
// group by a reduction into the (B, Hkv, S, D) outputs.
static void build_backward(builder &g, int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D, bool det)
{
    int64_t dim[4], str[4];
    q_layout(B, S, H, D, dim, str);
    desc_t q = g.tensor(CUDNN_DATA_BFLOAT16, dim, str, false, UID_Q);
    desc_t o = g.tensor(CUDNN_DATA_BFLOAT16, dim, str, false, UID_O);
    desc_t dO = g.tensor(CUDNN_DATA_BFLOAT16, dim, str, false, UID_DO);
    desc_t dQ = g.tensor(CUDNN_DATA_BFLOAT16, dim, str, false, UID_DQ);
    kt_layout(B, S, Hkv, D, dim, str);
    desc_t kt = g.tensor(CUDNN_DATA_BFLOAT16, dim, str, false, UID_K);
    desc_t vt_ = g.tensor(CUDNN_DATA_BFLOAT16, dim, str, false, UID_V);
    q_layout(B, S, Hkv, D, dim, str);
    desc_t dK = g.tensor(CUDNN_DATA_BFLOAT16, dim, str, false, UID_DK);
    desc_t dV = g.tensor(CUDNN_DATA_BFLOAT16, dim, str, false, UID_DV);
    desc_t kk = g.tensor(CUDNN_DATA_BFLOAT16, dim, str, true); // K itself, a reshape of K^T
    const int64_t sdim[4] = {B, H, S, 1}, sstr[4] = {H * S, S, 1, 1};
    desc_t stats = g.tensor(CUDNN_DATA_FLOAT, sdim, sstr, false, UID_STATS);
    desc_t ssum = g.tensor(CUDNN_DATA_FLOAT, sdim, sstr, false, UID_SOFTMAX_SUM);
    desc_t scale = g.scalar(UID_SCALE), neg = g.scalar(UID_NEG), one = g.scalar(UID_ONE);

    // softmax_sum = rowsum(dO * O) * 1
    desc_t t0 = g.vt(CUDNN_DATA_FLOAT, B, H, S, D);
    g.pointwise(CUDNN_POINTWISE_MUL, dO, o, NULL, t0);
    desc_t t1 = g.vt(CUDNN_DATA_FLOAT, B, H, S, 1);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, t0, t1);
    g.pointwise(CUDNN_POINTWISE_MUL, t1, one, NULL, ssum);

    // P = exp(mask(scale * Q K^T - stats))
    desc_t s0 = g.vt(CUDNN_DATA_FLOAT, B, H, S, S);
    g.matmul(q, kt, s0);
    desc_t s1 = g.vt(CUDNN_DATA_FLOAT, B, H, S, S);
    g.pointwise(CUDNN_POINTWISE_MUL, s0, scale, NULL, s1);
    desc_t s2 = g.vt(CUDNN_DATA_FLOAT, B, H, S, S);
    g.pointwise(CUDNN_POINTWISE_SUB, s1, stats, NULL, s2);
    desc_t s3 = g.causal_mask(s2, B, H, S, neg);
    desc_t p = g.vt(CUDNN_DATA_FLOAT, B, H, S, S);
    g.pointwise(CUDNN_POINTWISE_EXP, s3, NULL, NULL, p);

    // dV = P^T dO (per query head, then summed over the group)
    const int64_t tdim[4] = {B, H, S, S}, tstr[4] = {H * S * S, S * S, 1, S};
    desc_t pt = g.tensor(CUDNN_DATA_BFLOAT16, tdim, tstr, true);
    g.reshape(p, pt);
    if (H == Hkv) {
        g.matmul(pt, dO, dV);
    } else {
        desc_t full = g.vt(CUDNN_DATA_BFLOAT16, B, H, S, D);
        g.matmul(pt, dO, full);
        g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, dV);
    }

    // dS = P * (dO V^T - softmax_sum) * scale
    desc_t dp = g.vt(CUDNN_DATA_FLOAT, B, H, S, S);
    g.matmul(dO, vt_, dp);
    desc_t d1 = g.vt(CUDNN_DATA_FLOAT, B, H, S, S);
    g.pointwise(CUDNN_POINTWISE_SUB, dp, ssum, NULL, d1);
    desc_t d2 = g.vt(CUDNN_DATA_FLOAT, B, H, S, S);
    g.pointwise(CUDNN_POINTWISE_MUL, d1, p, NULL, d2);
    desc_t ds = g.vt(CUDNN_DATA_FLOAT, B, H, S, S);
    g.pointwise(CUDNN_POINTWISE_MUL, d2, scale, NULL, ds);

    // dK = dS^T Q
    desc_t dst = g.tensor(CUDNN_DATA_BFLOAT16, tdim, tstr, true);
    g.reshape(ds, dst);
    if (H == Hkv) {
        g.matmul(dst, q, dK);
    } else {
        desc_t full = g.vt(CUDNN_DATA_BFLOAT16, B, H, S, D);
        g.matmul(dst, q, full);
        g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, dK);
    }

    // dQ = dS K
    g.reshape(kt, kk);
    if (det) {
        g.matmul(ds, kk, dQ);
    } else {
        const int64_t adim[4] = {B, H, S, D}, astr[4] = {H * S * D, S * D, D, 1};
        desc_t acc = g.tensor(CUDNN_DATA_FLOAT, adim, astr, false, UID_DQ_ACCUM);
        g.matmul(ds, kk, acc);
        g.pointwise(CUDNN_POINTWISE_IDENTITY, acc, NULL, NULL, dQ);
    }
}

static bool engine_nondeterministic(mt_cudnn_attn *a, desc_t cfg)
{
    desc_t eng = NULL;
    if (a->bcreate(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) != CUDNN_STATUS_SUCCESS) return false;
    int64_t n = 0;
    bool nondet = false;
    if (a->bget(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eng) ==
        CUDNN_STATUS_SUCCESS) {
        cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
        int64_t k = 0;
        if (a->bget(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT,
                    &k, notes) == CUDNN_STATUS_SUCCESS)
            for (int64_t i = 0; i < k; i++)
                if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) nondet = true;
    }
    a->bdestroy(eng);
    return nondet;
}

static size_t align_up(size_t x) { return (x + WS_ALIGN - 1) / WS_ALIGN * WS_ALIGN; }

// The cached plan of a key, built on a miss. Called with a->mu held.
static plan_entry *get_plan(mt_cudnn_attn *a, int bwd, int B, int S, int H, int Hkv, int D, char *why,
                            size_t why_len, int *rc)
{
    const int det = bwd ? a->deterministic : 0;
    const int key[7] = {bwd, B, S, H, Hkv, D, det};
    for (int i = 0; i < a->n_plans; i++)
        if (!memcmp(a->plans[i]->key, key, sizeof key)) return a->plans[i];
    *rc = MT_CUDNN_EUNSUPPORTED;
    if (mt_cudnn_attn_shape_ok(a->version, bwd, S, H, Hkv, D, why, why_len)) return NULL;
    builder g;
    g.a = a;
    if (bwd) build_backward(g, B, S, H, Hkv, D, det);
    else build_forward(g, B, S, H, Hkv, D);
    desc_t graph = g.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    g.set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &a->handle, "graph handle");
    g.set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)g.ops.size(), g.ops.data(),
          "graph operations");
    g.finalize(graph, "operation graph");
    desc_t plan = NULL;
    size_t ws = 0;
    char first_err[256] = "no engine";
    const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    for (int m = 0; m < 2 && !g.failed && !plan; m++) {
        desc_t heur = NULL;
        if (a->bcreate(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur) != CUDNN_STATUS_SUCCESS) break;
        int64_t n = 0;
        std::vector<desc_t> cfgs;
        if (a->bset(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph) ==
                CUDNN_STATUS_SUCCESS &&
            a->bset(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[m]) == CUDNN_STATUS_SUCCESS &&
            a->bfinalize(heur) == CUDNN_STATUS_SUCCESS &&
            a->bget(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, NULL) ==
                CUDNN_STATUS_SUCCESS &&
            n > 0) {
            cfgs.assign((size_t)n, NULL);
            int64_t made = 0;
            for (; made < n; made++)
                if (a->bcreate(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[(size_t)made]) != CUDNN_STATUS_SUCCESS) break;
            cfgs.resize((size_t)made);
            int64_t got = 0;
            if (made == n && a->bget(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got,
                                     cfgs.data()) == CUDNN_STATUS_SUCCESS) {
                for (int64_t i = 0; i < got && !plan; i++) {
                    if (det && engine_nondeterministic(a, cfgs[(size_t)i])) continue;
                    desc_t p = NULL;
                    if (a->bcreate(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p) != CUDNN_STATUS_SUCCESS) continue;
                    cudnnStatus_t s = a->bset(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &a->handle);
                    if (!s) s = a->bset(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                        &cfgs[(size_t)i]);
                    if (!s) s = a->bfinalize(p);
                    int64_t w = 0, cnt = 0;
                    if (!s) s = a->bget(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt, &w);
                    if (s) {
                        if (!strcmp(first_err, "no engine")) {
                            char last[200] = {0};
                            a->last_error(last, sizeof last);
                            snprintf(first_err, sizeof first_err, "plan: %s %s", a->err_string(s), last);
                        }
                        a->bdestroy(p);
                        continue;
                    }
                    plan = p;
                    ws = (size_t)w;
                    // the plan's config (and the heuristics that made it)
                    // live as long as the plan
                    g.owned.push_back(cfgs[(size_t)i]);
                    cfgs[(size_t)i] = NULL;
                }
            }
            for (desc_t c : cfgs)
                if (c) a->bdestroy(c);
        } else if (!strcmp(first_err, "no engine")) {
            char last[200] = {0};
            a->last_error(last, sizeof last);
            snprintf(first_err, sizeof first_err, "heuristics found %lld configs %s", (long long)n, last);
        }
        if (plan) g.owned.push_back(heur);
        else a->bdestroy(heur);
    }
    if (g.failed || !plan) {
        sayf(why, why_len, "cuDNN %zu refuses the %s graph (B=%d S=%d H=%d Hkv=%d D=%d): %s", a->version,
             bwd ? "backward" : "forward", B, S, H, Hkv, D, g.failed ? g.msg : first_err);
        for (size_t i = g.owned.size(); i-- > 0;) a->bdestroy(g.owned[i]);
        return NULL;
    }
    plan_entry *e = new plan_entry();
    memcpy(e->key, key, sizeof key);
    e->plan = plan;
    e->engine_ws = ws;
    e->owned.swap(g.owned);
    size_t off = align_up(ws);
    if (bwd) {
        e->off_sum = off;
        off += align_up((size_t)B * H * S * sizeof(float));
        if (!det) {
            e->off_dq_accum = off;
            off += align_up((size_t)B * H * S * D * sizeof(float));
        }
    }
    e->total_ws = off;
    if (a->n_plans < MAX_PLANS) {
        a->plans[a->n_plans++] = e;
    } else { // replace round-robin
        free_entry(a, a->plans[a->next_evict]);
        a->plans[a->next_evict] = e;
        a->next_evict = (a->next_evict + 1) % MAX_PLANS;
    }
    *rc = 0;
    return e;
}

static int check_shape(int B, int S, int H, int Hkv, int D, char *why, size_t why_len)
{
    if (B < 0 || S < 0 || H <= 0 || Hkv <= 0 || D <= 0 || H % Hkv != 0) {
        sayf(why, why_len, "bad shape B=%d S=%d H=%d Hkv=%d D=%d", B, S, H, Hkv, D);
        return MT_CUDNN_EINVAL;
    }
    if (D % 8 != 0 || D > 256) {
        sayf(why, why_len, "head size %d: cuDNN takes multiples of 8 up to 256", D);
        return MT_CUDNN_EUNSUPPORTED;
    }
    return 0;
}

static int workspace_query(mt_cudnn_attn *a, int bwd, int B, int S, int H, int Hkv, int D, size_t *bytes, char *why,
                           size_t why_len)
{
    if (!a || !bytes) return MT_CUDNN_EINVAL;
    int rc = check_shape(B, S, H, Hkv, D, why, why_len);
    if (rc) return rc;
    if (B == 0 || S == 0) {
        *bytes = 0;
        return 0;
    }
    pthread_mutex_lock(&a->mu);
    plan_entry *e = get_plan(a, bwd, B, S, H, Hkv, D, why, why_len, &rc);
    if (e) *bytes = e->total_ws;
    pthread_mutex_unlock(&a->mu);
    return e ? 0 : rc;
}

extern "C" int mt_cudnn_attn_forward_workspace(mt_cudnn_attn *a, int B, int S, int H, int Hkv, int D, size_t *bytes,
                                               char *why, size_t why_len)
{
    return workspace_query(a, 0, B, S, H, Hkv, D, bytes, why, why_len);
}

extern "C" int mt_cudnn_attn_backward_workspace(mt_cudnn_attn *a, int B, int S, int H, int Hkv, int D,
                                                size_t *bytes, char *why, size_t why_len)
{
    return workspace_query(a, 1, B, S, H, Hkv, D, bytes, why, why_len);
}

static bool aligned(const void *p) { return p && ((uintptr_t)p & 15) == 0; }

// Runs the plan of (bwd, shape) with the given (uid, pointer) pairs plus the
// by-value scalars and the workspace tensors.
static int run(mt_cudnn_attn *a, void *stream, int bwd, int B, int S, int H, int Hkv, int D, float scale,
               const int64_t *uids, void *const *ptrs, int n, void *workspace, size_t workspace_bytes, char *why,
               size_t why_len)
{
    if (!a) return MT_CUDNN_EINVAL;
    int rc = check_shape(B, S, H, Hkv, D, why, why_len);
    if (rc) return rc;
    if (!(scale > 0.0f)) {
        sayf(why, why_len, "scale must be > 0");
        return MT_CUDNN_EINVAL;
    }
    for (int i = 0; i < n; i++)
        if (!aligned(ptrs[i])) {
            sayf(why, why_len, "tensor %d is NULL or not 16-byte aligned", (int)uids[i]);
            return MT_CUDNN_EINVAL;
        }
    if (B == 0 || S == 0) return 0;
    pthread_mutex_lock(&a->mu);
    plan_entry *e = get_plan(a, bwd, B, S, H, Hkv, D, why, why_len, &rc);
    if (!e) {
        pthread_mutex_unlock(&a->mu);
        return rc;
    }
    if (e->total_ws && (!workspace || workspace_bytes < e->total_ws || ((uintptr_t)workspace & 15))) {
        pthread_mutex_unlock(&a->mu);
        sayf(why, why_len, "workspace of %zu bytes at %p, the plan needs %zu 16-byte aligned", workspace_bytes,
             workspace, e->total_ws);
        return MT_CUDNN_EWORKSPACE;
    }
    // By-value scalars are read from host memory when the plan is executed.
    float scale_v = scale, neg_v = -FLT_MAX, one_v = 1.0f;
    int64_t all_uids[16];
    void *all_ptrs[16];
    int m = 0;
    for (int i = 0; i < n; i++) all_uids[m] = uids[i], all_ptrs[m++] = ptrs[i];
    all_uids[m] = UID_SCALE, all_ptrs[m++] = &scale_v;
    all_uids[m] = UID_NEG, all_ptrs[m++] = &neg_v;
    if (bwd) {
        all_uids[m] = UID_ONE, all_ptrs[m++] = &one_v;
        all_uids[m] = UID_SOFTMAX_SUM, all_ptrs[m++] = (char *)workspace + e->off_sum;
        if (!e->key[6]) all_uids[m] = UID_DQ_ACCUM, all_ptrs[m++] = (char *)workspace + e->off_dq_accum;
    }
    void *ws = e->engine_ws ? workspace : NULL;
    desc_t vp = NULL;
    cudnnStatus_t s = a->bcreate(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    if (!s) s = a->bset(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, m, all_uids);
    if (!s) s = a->bset(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, m, all_ptrs);
    if (!s) s = a->bset(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    if (!s) s = a->bfinalize(vp);
    if (!s) s = a->set_stream(a->handle, (cudaStream_t)stream);
    if (!s) s = a->bexecute(a->handle, e->plan, vp);
    if (s) {
        char last[256] = {0};
        a->last_error(last, sizeof last);
        sayf(why, why_len, "cudnnBackendExecute (%s): %s %s", bwd ? "backward" : "forward", a->err_string(s), last);
        rc = MT_CUDNN_EEXEC;
    }
    if (vp) a->bdestroy(vp);
    pthread_mutex_unlock(&a->mu);
    return rc;
}

extern "C" int mt_cudnn_attn_forward(mt_cudnn_attn *a, void *stream, void *out, float *lse, const void *q,
                                     const void *k, const void *v, int B, int S, int H, int Hkv, int D, float scale,
                                     void *workspace, size_t workspace_bytes, char *why, size_t why_len)
{
    const int64_t uids[5] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS};
    void *const ptrs[5] = {(void *)q, (void *)k, (void *)v, out, lse};
    return run(a, stream, 0, B, S, H, Hkv, D, scale, uids, ptrs, 5, workspace, workspace_bytes, why, why_len);
}

extern "C" int mt_cudnn_attn_backward(mt_cudnn_attn *a, void *stream, void *dq, void *dk, void *dv,
                                      const void *dout, const void *out, const float *lse, const void *q,
                                      const void *k, const void *v, int B, int S, int H, int Hkv, int D, float scale,
                                      void *workspace, size_t workspace_bytes, char *why, size_t why_len)
{
    const int64_t uids[9] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV};
    void *const ptrs[9] = {(void *)q, (void *)k, (void *)v, (void *)out, (void *)lse, (void *)dout, dq, dk, dv};
    return run(a, stream, 1, B, S, H, Hkv, D, scale, uids, ptrs, 9, workspace, workspace_bytes, why, why_len);
}

extern "C" int mt_cudnn_attn_check_ops(int B, int S, int H, int Hkv, int D, size_t *version, char *why,
                                       size_t why_len)
{
    int rc = check_shape(B, S, H, Hkv, D, why, why_len);
    if (rc) return rc;
    if (B == 0 || S == 0) return MT_CUDNN_EINVAL;
    mt_cudnn_attn *a = load(why, why_len);
    if (!a) return MT_CUDNN_EUNSUPPORTED;
    if (version) *version = a->version;
    for (int k = 0; k < 3 && !rc; k++) {
        builder g;
        g.a = a;
        if (k == 0) build_forward(g, B, S, H, Hkv, D);
        else build_backward(g, B, S, H, Hkv, D, k == 1);
        if (g.failed) {
            sayf(why, why_len, "%s: %s", k == 0 ? "forward" : k == 1 ? "deterministic backward" : "backward", g.msg);
            rc = MT_CUDNN_EUNSUPPORTED;
        }
        for (size_t i = g.owned.size(); i-- > 0;) a->bdestroy(g.owned[i]);
    }
    mt_cudnn_attn_destroy(a);
    return rc;
}
