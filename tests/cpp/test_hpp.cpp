/* Checks the C++ wrapper (include/megatrain.hpp) against the library: errors
 * and their messages, ownership of handles, the wrapped calls, and the abort
 * callback. Stops at the first failed check with a line saying which; the
 * last line is "hpp: N passed, 0 failed". tests/cpp/check.sh builds and runs
 * it against an installed library. */
#include <megatrain.hpp>

#include <dlfcn.h>
#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace fs = std::filesystem;

/* Every handle the program destroys or closes, in order. These definitions
 * take the place of the library's for this program's own calls (the
 * wrapper's destructors included) and pass each call on, so the test sees
 * whether a handle is freed exactly once. */
static std::vector<const void *> destroyed;

template <class Fn> static Fn next_definition(const char *name)
{
    void *sym = dlsym(RTLD_NEXT, name);
    if (!sym) {
        std::fprintf(stderr, "hpp: FAILED: no %s to forward to: %s\n", name, dlerror());
        std::exit(1);
    }
    Fn fn;
    std::memcpy(&fn, &sym, sizeof fn); /* object to function pointer, without a cast ISO C++ leaves open */
    return fn;
}

extern "C" void mt_model_destroy(mt_model *model)
{
    static const auto real = next_definition<void (*)(mt_model *)>("mt_model_destroy");
    if (model) destroyed.push_back(model);
    real(model);
}

extern "C" void mt_dataset_close(mt_dataset *ds)
{
    static const auto real = next_definition<void (*)(mt_dataset *)>("mt_dataset_close");
    if (ds) destroyed.push_back(ds);
    real(ds);
}

namespace {

int passed = 0;
fs::path scratch; // files the test writes, removed at the end or on a failure

void check(bool ok, const char *what, int line)
{
    if (!ok) {
        std::fprintf(stderr, "hpp: FAILED at line %d: %s\n", line, what);
        std::error_code ignored;
        fs::remove_all(scratch, ignored);
        std::printf("hpp: %d passed, 1 failed\n", passed);
        std::exit(1);
    }
    passed++;
}
#define CHECK(cond) check((cond), #cond, __LINE__)

/* The mt::error that f throws; a failed check when it throws none. */
template <class F> mt::error thrown_by(F f, const char *what, int line)
{
    try {
        f();
    } catch (const mt::error &e) {
        return e;
    }
    check(false, what, line);
    return mt::error(MT_OK, "");
}
#define THROWN_BY(expr) thrown_by([&] { expr; }, "no mt::error from " #expr, __LINE__)

std::size_t times_destroyed(const void *handle)
{
    std::size_t n = 0;
    for (const void *h : destroyed) n += h == handle;
    return n;
}

mt::model_config small_config()
{
    mt::model_config cfg;
    cfg.vocab_size = 32;
    cfg.hidden_size = 64;
    cfg.intermediate_size = 128;
    cfg.num_hidden_layers = 2;
    cfg.num_attention_heads = 4;
    cfg.num_key_value_heads = 2;
    cfg.max_position_embeddings = 64;
    cfg.precision = MT_PRECISION_FP32;
    return cfg;
}

mt::offload_policy cpu_policy()
{
    mt::offload_policy pol;
    pol.backend = MT_BACKEND_CPU;
    return pol;
}

constexpr std::uint32_t n_seq = 2;
constexpr std::uint32_t seq_len = 16;

/* A batch over tokens and targets, which are filled with a period-5 pattern. */
mt::batch pattern_batch(std::vector<std::int32_t> &tokens, std::vector<std::int32_t> &targets)
{
    tokens.resize(n_seq * seq_len);
    targets.resize(n_seq * seq_len);
    for (std::uint32_t i = 0; i < n_seq * seq_len; i++) {
        tokens[i] = static_cast<std::int32_t>(3 + i % 5);
        targets[i] = static_cast<std::int32_t>(3 + (i + 1) % 5);
    }
    mt::batch b;
    b.micro_batch_size = n_seq;
    b.seq_len = seq_len;
    b.num_micro_batches = 1;
    b.tokens = tokens.data();
    b.targets = targets.data();
    return b;
}

void test_errors()
{
    mt::model_config bad;
    bad.num_attention_heads = 7;
    const mt::error e = THROWN_BY(mt::model m(bad, cpu_policy()));
    CHECK(e.status() == MT_ERR_INVALID_ARGUMENT);
    CHECK(*e.message() != '\0');
    CHECK(std::string(e.message()) == mt_last_errmsg());
    CHECK(std::string(e.what()) == std::string(mt_status_str(e.status())) + ": " + e.message());
    const mt::error copy = e;
    CHECK(copy.status() == e.status() && std::string(copy.what()) == e.what());
    CHECK(std::string(mt::error(MT_ERR_IO, "").what()) == mt_status_str(MT_ERR_IO));

    const mt::error cl = THROWN_BY(mt::config_load("no-such-model-folder"));
    CHECK(cl.status() != MT_OK && *cl.message() != '\0');
}

void test_model_calls()
{
    mt::model m(small_config(), cpu_policy());
    CHECK(m && m.get() != nullptr);
    CHECK(m.num_params() > 0);
    CHECK(m.backend() == MT_BACKEND_CPU);
    CHECK(m.step_count() == 0);
    CHECK(m.get_config().vocab_size == 32);

    mt::offload_policy pol = cpu_policy();
    CHECK(mt::plan(small_config(), &pol).num_params == m.num_params());
    pol.host_budget_bytes = 1;
    try {
        mt::plan(small_config(), &pol);
        check(false, "a 1-byte host budget was not refused", __LINE__);
    } catch (const mt::plan_error &e) {
        CHECK(e.status() == MT_ERR_HOST_BUDGET);
        CHECK(e.plan().num_params == m.num_params());
    }

    std::vector<std::int32_t> tokens, targets;
    mt::batch b = pattern_batch(tokens, targets);
    mt::optim_config opt;
    mt_step_stats stats = m.step(b, opt);
    CHECK(stats.step == 1 && m.step_count() == 1);
    CHECK(std::isfinite(stats.loss) && stats.tokens == n_seq * seq_len);

    // a token id past the vocabulary: refused, with the model's message, and no step taken
    tokens[5] = 99;
    const mt::error e = THROWN_BY(m.step(b, opt));
    CHECK(e.status() == MT_ERR_INVALID_ARGUMENT);
    CHECK(*e.message() != '\0');
    CHECK(std::string(e.message()) == mt_model_errmsg(m.get()));
    CHECK(m.step_count() == 1);
    tokens[5] = 3 + 5 % 5;

    const mt_eval_stats ev = m.eval(b);
    CHECK(std::isfinite(ev.loss) && ev.target_tokens == n_seq * seq_len);
    const std::vector<float> logits = m.logits(tokens.data(), n_seq, seq_len);
    CHECK(logits.size() == n_seq * 32);
    CHECK(THROWN_BY(m.timeline()).status() == MT_ERR_UNSUPPORTED); // CPU backend

    // a Hugging Face folder and a resume checkpoint, loaded into a second model
    const std::string hf = (scratch / "hf").string(), ckpt = (scratch / "ckpt").string();
    m.save(hf);
    CHECK(mt::config_load(hf).hidden_size == 64);
    mt::checkpoint_info info;
    info.data_position = 7;
    info.rng_state[3] = 42;
    m.checkpoint_save(ckpt, info);
    mt::model other(small_config(), cpu_policy());
    other.load(hf);
    CHECK(other.logits(tokens.data(), n_seq, seq_len) == logits);
    const mt::checkpoint_info back = other.checkpoint_load(ckpt);
    CHECK(back.step == 1 && back.data_position == 7 && back.rng_state[3] == 42);
    CHECK(other.step_count() == 1);
    CHECK(THROWN_BY(other.load((scratch / "nothing").string())).status() != MT_OK);
}

void test_model_ownership()
{
    destroyed.clear();
    mt::model a(small_config(), cpu_policy());
    mt_model *const h = a.get();

    mt::model b(std::move(a));
    CHECK(!a && a.get() == nullptr && b.get() == h);
    CHECK(a.num_params() == 0); // the library's answer for no model
    CHECK(THROWN_BY(a.get_config()).status() == MT_ERR_INVALID_ARGUMENT);

    mt::model c(small_config(), cpu_policy());
    mt_model *const h2 = c.get();
    c = std::move(b); // frees what c held
    CHECK(!b && c.get() == h);
    CHECK(times_destroyed(h2) == 1 && times_destroyed(h) == 0);

    mt::model empty;
    c.swap(empty);
    CHECK(!c && empty.get() == h);
    mt_model *const raw = empty.release();
    CHECK(raw == h && !empty);
    mt::model adopted(raw);
    {
        mt::model last(std::move(adopted));
    }
    CHECK(times_destroyed(h) == 1 && times_destroyed(h2) == 1);
    CHECK(destroyed.size() == 2); // the moved-from and empty ones freed nothing
}

void test_dataset()
{
    const mt::error e = THROWN_BY(mt::dataset d((scratch / "missing.bin").string()));
    CHECK(e.status() == MT_ERR_IO);
    CHECK(std::string(e.message()).find("missing.bin") != std::string::npos);

    // 1000 raw uint16 tokens: 0, 1, ..., 999 mod 256
    const std::string path = (scratch / "tokens.u16").string();
    {
        std::ofstream f(path, std::ios::binary);
        for (unsigned i = 0; i < 1000; i++) {
            const unsigned char le[2] = {static_cast<unsigned char>(i % 256), 0};
            f.write(reinterpret_cast<const char *>(le), 2);
        }
    }
    mt::dataset_options opt;
    opt.format = MT_TOKENS_U16;
    opt.seq_len = 8;
    opt.heldout_fraction = 0.1f;
    mt::dataset d(path, opt);
    CHECK(d.num_tokens() == 1000 && d.seq_len() == 8);
    CHECK(d.num_windows(MT_SPLIT_TRAIN) > 0 && d.num_windows(MT_SPLIT_HELDOUT) > 0);
    std::vector<std::int32_t> tokens, targets;
    d.read(MT_SPLIT_HELDOUT, 0, 3, tokens, targets);
    CHECK(tokens.size() == 24 && targets.size() == 24);
    bool shifted = true;
    for (std::size_t i = 0; i < tokens.size(); i++) shifted = shifted && targets[i] == (tokens[i] + 1) % 256;
    CHECK(shifted);

    destroyed.clear();
    const mt_dataset *const h = d.get();
    mt::dataset moved(std::move(d));
    CHECK(!d && moved.get() == h && moved.seq_len() == 8);
    CHECK(THROWN_BY(d.read(MT_SPLIT_TRAIN, 0, 1, tokens, targets)).status() == MT_ERR_INVALID_ARGUMENT);
    moved.close();
    moved.close();
    CHECK(!moved && times_destroyed(h) == 1 && destroyed.size() == 1);
}

/* Last, as it needs the library to poll mt_offload_policy.abort_callback. */
void test_abort()
{
    std::vector<std::int32_t> tokens, targets;
    const mt::batch b = pattern_batch(tokens, targets);
    const mt::optim_config opt;

    int calls = 0;
    bool stop = false;
    mt::model first(small_config(), cpu_policy(), [&] {
        calls++;
        return stop;
    });
    mt::model m(std::move(first)); // the function stays where the handle looks for it
    m.step(b, opt);
    CHECK(m.step_count() == 1);
    check(calls > 0, "the library polled the abort callback during a step", __LINE__);

    stop = true;
    const mt::error e = THROWN_BY(m.step(b, opt));
    CHECK(e.status() == MT_ERR_ABORTED);
    CHECK(m.step_count() == 1);

    // an exception from the callback comes out of the call it stopped, once
    bool throw_now = false;
    mt::model t(small_config(), cpu_policy(), [&]() -> bool {
        if (throw_now) throw std::out_of_range("stop here");
        return false;
    });
    throw_now = true;
    bool rethrown = false;
    try {
        t.step(b, opt);
    } catch (const std::out_of_range &x) {
        rethrown = std::string(x.what()) == "stop here";
    } catch (const mt::error &) {
        rethrown = false;
    }
    CHECK(rethrown);
    CHECK(t.step_count() == 0);
    throw_now = false;
    t.step(b, opt);
    CHECK(t.step_count() == 1);
}

} // namespace

int main()
{
    std::string name = (fs::temp_directory_path() / "megatrain-hpp-XXXXXX").string();
    if (!mkdtemp(&name[0])) {
        std::fprintf(stderr, "hpp: cannot create a scratch directory %s\n", name.c_str());
        return 1;
    }
    scratch = name;

    try {
        test_errors();
        test_model_calls();
        test_model_ownership();
        test_dataset();
        test_abort();
    } catch (const std::exception &e) {
        check(false, e.what(), __LINE__); // thrown by a call that should have worked
    }
    fs::remove_all(scratch);
    std::printf("hpp: %d passed, 0 failed\n", passed);
    return 0;
}
