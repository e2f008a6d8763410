/*
 * megatrain.hpp - a header-only C++17 wrapper of libmegatrain's C API.
 *
 * It adds ownership and exceptions and nothing else:
 * - mt::model, mt::dataset and mt::doc_writer are move-only owners of the C
 *   handles;
 * - every failed call throws mt::error, which carries the mt_status and the
 *   library's message;
 * - mt::model_config, mt::offload_policy, ... are the C option structs with
 *   their mt_X_init() defaults applied by the constructor, so the field names
 *   and their documentation are megatrain.h's. Functions take the C structs
 *   (by reference, or by pointer where C gives null a meaning), so plain C
 *   structs work as well.
 * The wrapper keeps no global state, and the rules of megatrain.h (threads,
 * handles left as they were after a failed call, CUDA devices) hold as they
 * are; megatrain.h is the reference for what each call does.
 *
 *     c++ -std=c++17 prog.cpp $(pkg-config --cflags --libs megatrain)
 */
#ifndef MEGATRAIN_HPP
#define MEGATRAIN_HPP

#include <megatrain.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace mt {

/* ---- errors ---------------------------------------------------------------- */

/* A failed call. what() is "<mt_status_str(status)>: <message>" (the status
 * string alone when the library left no message); message() is the
 * library's message by itself. Copying never throws: both live in the one
 * string that std::runtime_error keeps. */
class error : public std::runtime_error {
public:
    error(mt_status status, const char *message)
        : std::runtime_error(compose(status, message)), status_(status),
          message_offset_(std::strlen(mt_status_str(status)) + (message && *message ? 2 : 0))
    {
    }

    mt_status status() const noexcept { return status_; }
    const char *message() const noexcept { return what() + message_offset_; }

private:
    static std::string compose(mt_status status, const char *message)
    {
        std::string s = mt_status_str(status);
        if (message && *message) s.append(": ").append(message);
        return s;
    }

    mt_status status_;
    std::size_t message_offset_;
};

/* Thrown by mt::plan() when the plan does not fit the budgets
 * (MT_ERR_HOST_BUDGET, MT_ERR_GPU_BUDGET): the library fills the plan all
 * the same, and a caller asking "would it fit?" wants its numbers. */
class plan_error : public error {
public:
    plan_error(mt_status status, const char *message, const mt_memory_plan &plan)
        : error(status, message), plan_(plan)
    {
    }

    const mt_memory_plan &plan() const noexcept { return plan_; }

private:
    mt_memory_plan plan_;
};

namespace detail {

/* For calls without a handle, whose message is per thread: it is read here,
 * before any other call on this thread can replace it. */
inline void check(mt_status status)
{
    if (status != MT_OK) throw error(status, mt_last_errmsg());
}

} // namespace detail

/* ---- option structs ---------------------------------------------------------- */

/* The C structs, set to the library's defaults by mt_X_init(). They add no
 * members, so each is exactly its C struct and struct_size is this header's
 * sizeof, as for a C caller. */
struct model_config : mt_model_config {
    model_config() noexcept { mt_model_config_init(this); }
};

struct offload_policy : mt_offload_policy {
    offload_policy() noexcept { mt_offload_policy_init(this); }
};

struct optim_config : mt_optim_config {
    optim_config() noexcept { mt_optim_config_init(this); }
};

struct batch_shape : mt_batch_shape {
    batch_shape() noexcept { mt_batch_shape_init(this); }
};

/* tokens and targets point at the caller's arrays, which must outlive the
 * calls the batch is passed to. */
struct batch : mt_batch {
    batch() noexcept { mt_batch_init(this); }
};

struct checkpoint_info : mt_checkpoint_info {
    checkpoint_info() noexcept { mt_checkpoint_info_init(this); }
};

struct dataset_options : mt_dataset_options {
    dataset_options() noexcept { mt_dataset_options_init(this); }
};

/* ---- calls without a model ------------------------------------------------------ */

/* mt_plan: pol null means the defaults, shape null the model's persistent
 * state alone. Throws mt::plan_error, with the plan, when it does not fit. */
inline mt_memory_plan plan(const mt_model_config &cfg, const mt_offload_policy *pol = nullptr,
                           const mt_batch_shape *shape = nullptr)
{
    mt_memory_plan p;
    mt_memory_plan_init(&p);
    const mt_status status = mt_plan(&p, &cfg, pol, shape);
    if (status == MT_ERR_HOST_BUDGET || status == MT_ERR_GPU_BUDGET)
        throw plan_error(status, mt_last_errmsg(), p);
    detail::check(status);
    return p;
}

/* mt_config_load into a caller's config, whose precision, seed and
 * initializer_range are kept. */
inline void config_load(mt_model_config &cfg, const std::string &dir)
{
    detail::check(mt_config_load(&cfg, dir.c_str()));
}

/* mt_config_load with the defaults for what config.json does not say. */
inline model_config config_load(const std::string &dir)
{
    model_config cfg;
    config_load(cfg, dir);
    return cfg;
}

/* ---- the model -------------------------------------------------------------------- */

namespace detail {

/* What mt_offload_policy.abort_user_data points at: the caller's function
 * and the exception it threw, if it did, which must not cross the C library
 * and is rethrown by the wrapper once the aborted call has returned. */
struct abort_state {
    std::function<bool()> should_abort;
    std::exception_ptr thrown;
};

inline int call_abort(void *user_data) noexcept
{
    abort_state *s = static_cast<abort_state *>(user_data);
    if (s->thrown) return 1; /* already stopping */
    try {
        return s->should_abort() ? 1 : 0;
    } catch (...) {
        s->thrown = std::current_exception();
        return 1;
    }
}

} // namespace detail

/* An mt_model: created from a config and an offload policy, destroyed with
 * the object. Move-only; a moved-from or default-constructed model is empty
 * (get() is null), and the C library refuses calls on it with
 * MT_ERR_INVALID_ARGUMENT (queries return 0). Like the handle, one model
 * must not be used by two threads at once. */
class model {
public:
    /* Polled during long calls; returning true stops the call with
     * MT_ERR_ABORTED. */
    using abort_function = std::function<bool()>;

    model() noexcept = default;

    explicit model(const mt_model_config &cfg) { create(cfg, nullptr, nullptr); }

    model(const mt_model_config &cfg, const mt_offload_policy &pol) { create(cfg, &pol, nullptr); }

    /* With should_abort as the policy's abort callback (replacing any that
     * pol sets; an empty function installs none). The function is kept on
     * the heap with the handle, so moving the model does not move it; it is
     * called from the thread that called into the model, and destroyed after
     * the handle. An exception it throws stops the call as returning true
     * would, and that call then throws it instead of
     * mt::error(MT_ERR_ABORTED). */
    model(const mt_model_config &cfg, const mt_offload_policy &pol, abort_function should_abort)
    {
        create(cfg, &pol, std::move(should_abort));
    }

    /* Takes ownership of a handle from mt_model_create. */
    explicit model(mt_model *handle) noexcept : handle_(handle) {}

    ~model() { mt_model_destroy(handle_); } /* before abort_, which the handle may call */

    model(const model &) = delete;
    model &operator=(const model &) = delete;

    model(model &&other) noexcept
        : handle_(std::exchange(other.handle_, nullptr)), abort_(std::move(other.abort_))
    {
    }

    model &operator=(model &&other) noexcept
    {
        model taken(std::move(other));
        swap(taken);
        return *this; /* taken destroys what this held, handle first */
    }

    void swap(model &other) noexcept
    {
        std::swap(handle_, other.handle_);
        std::swap(abort_, other.abort_);
    }

    friend void swap(model &a, model &b) noexcept { a.swap(b); }

    mt_model *get() const noexcept { return handle_; }
    explicit operator bool() const noexcept { return handle_ != nullptr; }

    /* Gives the handle up: the caller destroys it with mt_model_destroy.
     * An abort function is given up too and never freed, because the handle
     * still calls it. */
    mt_model *release() noexcept
    {
        static_cast<void>(abort_.release());
        return std::exchange(handle_, nullptr);
    }

    /* One optimizer step; on failure the model is as it was (step_count too). */
    mt_step_stats step(const mt_batch &b, const mt_optim_config &opt)
    {
        mt_step_stats stats;
        mt_step_stats_init(&stats);
        check(mt_step(handle_, &b, &opt, &stats));
        return stats;
    }

    mt_eval_stats eval(const mt_batch &b)
    {
        mt_eval_stats stats;
        mt_eval_stats_init(&stats);
        check(mt_eval(handle_, &b, &stats));
        return stats;
    }

    /* Next-token logits after each of n_seq sequences of seq_len tokens into
     * out[n_seq * vocab_size]. */
    void logits(const std::int32_t *tokens, std::uint32_t n_seq, std::uint32_t seq_len, float *out)
    {
        check(mt_model_logits(handle_, tokens, n_seq, seq_len, out));
    }

    std::vector<float> logits(const std::int32_t *tokens, std::uint32_t n_seq, std::uint32_t seq_len)
    {
        std::vector<float> out(std::size_t{n_seq} * get_config().vocab_size);
        logits(tokens, n_seq, seq_len, out.data());
        return out;
    }

    /* Hugging Face model folders: config.json and model.safetensors. */
    void save(const std::string &dir) { check(mt_model_save(handle_, dir.c_str())); }
    void load(const std::string &dir) { check(mt_model_load(handle_, dir.c_str())); }

    /* Resume checkpoints: dir/step-NNNNNNNN and dir/latest. */
    void checkpoint_save(const std::string &dir) { check(mt_checkpoint_save(handle_, dir.c_str(), nullptr)); }

    void checkpoint_save(const std::string &dir, const mt_checkpoint_info &info)
    {
        check(mt_checkpoint_save(handle_, dir.c_str(), &info));
    }

    /* Returns what the checkpoint carries besides the model: its step, and
     * the caller's data position and random state. */
    checkpoint_info checkpoint_load(const std::string &dir)
    {
        checkpoint_info info;
        check(mt_checkpoint_load(handle_, dir.c_str(), &info));
        return info;
    }

    model_config get_config() const
    {
        model_config cfg;
        check(mt_model_get_config(handle_, &cfg));
        return cfg;
    }

    std::uint64_t num_params() const noexcept { return mt_model_num_params(handle_); }
    mt_backend backend() const noexcept { return mt_model_backend(handle_); }
    std::uint64_t step_count() const noexcept { return mt_model_step_count(handle_); }

    /* The last step's timeline and its first cap visits (see mt_model_timeline:
     * CUDA backend with the policy's timeline set only). */
    mt_timeline timeline(mt_timeline_visit *visits = nullptr, std::uint32_t cap = 0)
    {
        mt_timeline t;
        mt_timeline_init(&t);
        check(mt_model_timeline(handle_, &t, visits, cap));
        return t;
    }

    /* The same with all of the step's visits, in visits. */
    mt_timeline timeline(std::vector<mt_timeline_visit> &visits)
    {
        mt_timeline t = timeline();
        visits.resize(t.n_visits);
        return timeline(visits.data(), t.n_visits);
    }

private:
    void create(const mt_model_config &cfg, const mt_offload_policy *pol, abort_function should_abort)
    {
        mt_offload_policy with_abort;
        if (should_abort) {
            abort_.reset(new detail::abort_state{std::move(should_abort), nullptr});
            with_abort = *pol;
            with_abort.abort_callback = &detail::call_abort;
            with_abort.abort_user_data = abort_.get();
            pol = &with_abort;
        }
        const mt_status status = mt_model_create(&handle_, &cfg, pol);
        if (status != MT_OK) finish(status, mt_last_errmsg());
    }

    void check(mt_status status) const
    {
        if (status != MT_OK || abort_) finish(status, mt_model_errmsg(handle_));
    }

    /* Throws for a failed call, rethrowing the abort function's exception
     * for the call it stopped; either way that exception is spent. */
    void finish(mt_status status, const char *message) const
    {
        std::exception_ptr thrown = abort_ ? std::exchange(abort_->thrown, nullptr) : nullptr;
        if (status == MT_OK) return;
        if (status == MT_ERR_ABORTED && thrown) std::rethrow_exception(thrown);
        throw error(status, message);
    }

    mt_model *handle_ = nullptr;
    std::unique_ptr<detail::abort_state> abort_;
};

/* ---- token data -------------------------------------------------------------------- */

/* An mt_dataset: a token file opened with mt_dataset_open, closed with the
 * object or by close(). Move-only; moved-from or default-constructed is
 * empty. Read-only once open, so one dataset may serve several threads. */
class dataset {
public:
    dataset() noexcept = default;

    explicit dataset(const std::string &path) : dataset(path, dataset_options()) {}

    dataset(const std::string &path, const mt_dataset_options &opt)
    {
        detail::check(mt_dataset_open(&handle_, path.c_str(), &opt));
        seq_len_ = opt.seq_len;
    }

    /* Takes ownership of a handle from mt_dataset_open, which was given
     * seq_len (the C API cannot tell it). */
    dataset(mt_dataset *handle, std::uint32_t seq_len) noexcept : handle_(handle), seq_len_(seq_len) {}

    ~dataset() { mt_dataset_close(handle_); }

    dataset(const dataset &) = delete;
    dataset &operator=(const dataset &) = delete;

    dataset(dataset &&other) noexcept
        : handle_(std::exchange(other.handle_, nullptr)), seq_len_(std::exchange(other.seq_len_, 0))
    {
    }

    dataset &operator=(dataset &&other) noexcept
    {
        dataset taken(std::move(other));
        swap(taken);
        return *this;
    }

    void swap(dataset &other) noexcept
    {
        std::swap(handle_, other.handle_);
        std::swap(seq_len_, other.seq_len_);
    }

    friend void swap(dataset &a, dataset &b) noexcept { a.swap(b); }

    /* Closes the file now; the dataset is then empty. */
    void close() noexcept
    {
        mt_dataset_close(std::exchange(handle_, nullptr));
        seq_len_ = 0;
    }

    mt_dataset *get() const noexcept { return handle_; }
    explicit operator bool() const noexcept { return handle_ != nullptr; }

    mt_dataset *release() noexcept
    {
        seq_len_ = 0;
        return std::exchange(handle_, nullptr);
    }

    std::uint64_t num_tokens() const noexcept { return mt_dataset_num_tokens(handle_); }
    std::uint64_t num_windows(mt_split split) const noexcept { return mt_dataset_num_windows(handle_, split); }

    /* The options' seq_len: each sequence read holds this many tokens. */
    std::uint32_t seq_len() const noexcept { return seq_len_; }

    /* n_seq sequences from window `position` of split into
     * tokens[n_seq * seq_len()] and targets[n_seq * seq_len()]. */
    void read(mt_split split, std::uint64_t position, std::uint32_t n_seq, std::int32_t *tokens,
              std::int32_t *targets) const
    {
        detail::check(mt_dataset_read(handle_, split, position, n_seq, tokens, targets));
    }

    /* The same into vectors, which are resized to n_seq * seq_len(). */
    void read(mt_split split, std::uint64_t position, std::uint32_t n_seq, std::vector<std::int32_t> &tokens,
              std::vector<std::int32_t> &targets) const
    {
        tokens.resize(std::size_t{n_seq} * seq_len_);
        targets.resize(tokens.size());
        read(split, position, n_seq, tokens.data(), targets.data());
    }

private:
    mt_dataset *handle_ = nullptr;
    std::uint32_t seq_len_ = 0;
};

/* An mt_doc_writer: a document file being written (mt_doc_writer_create),
 * put under its name by finish(); destroyed unfinished, it leaves no file.
 * Move-only; moved-from or default-constructed is empty. */
class doc_writer {
public:
    doc_writer() noexcept = default;

    doc_writer(const std::string &path, std::uint32_t vocab_size)
    {
        detail::check(mt_doc_writer_create(&handle_, path.c_str(), vocab_size));
    }

    explicit doc_writer(mt_doc_writer *handle) noexcept : handle_(handle) {}
    ~doc_writer() { mt_doc_writer_free(handle_); }

    doc_writer(const doc_writer &) = delete;
    doc_writer &operator=(const doc_writer &) = delete;
    doc_writer(doc_writer &&other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
    doc_writer &operator=(doc_writer &&other) noexcept
    {
        doc_writer taken(std::move(other));
        swap(taken);
        return *this;
    }
    void swap(doc_writer &other) noexcept { std::swap(handle_, other.handle_); }
    friend void swap(doc_writer &a, doc_writer &b) noexcept { a.swap(b); }

    mt_doc_writer *get() const noexcept { return handle_; }
    explicit operator bool() const noexcept { return handle_ != nullptr; }
    mt_doc_writer *release() noexcept { return std::exchange(handle_, nullptr); }

    /* targets: n flags (1: learnt), or nullptr: all learnt. */
    void append(const std::int32_t *tokens, const std::uint8_t *targets, std::size_t n)
    {
        detail::check(mt_doc_writer_append(handle_, tokens, targets, n));
    }
    /* Every token learnt (target true) or none. */
    void append(const std::vector<std::int32_t> &tokens, bool target = true)
    {
        std::vector<std::uint8_t> flags(tokens.size(), target ? 1 : 0);
        append(tokens.data(), flags.data(), tokens.size());
    }
    void end_document() { detail::check(mt_doc_writer_end_document(handle_)); }
    void finish() { detail::check(mt_doc_writer_finish(handle_)); }

    std::uint64_t num_tokens() const noexcept { return mt_doc_writer_num_tokens(handle_); }
    std::uint64_t num_targets() const noexcept { return mt_doc_writer_num_targets(handle_); }
    std::uint64_t num_documents() const noexcept { return mt_doc_writer_num_documents(handle_); }

private:
    mt_doc_writer *handle_ = nullptr;
};

} // namespace mt

#endif /* MEGATRAIN_HPP */
