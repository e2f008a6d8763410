package megatrain

// #include <megatrain.h>
// #include <stdlib.h>
import "C"

import (
	"runtime"
	"runtime/cgo"
	"sync"
	"unsafe"
)

// Model is a model with its optimizer state (mt_model).
//
// The library forbids using one model from two threads at once, so every
// method takes the model's mutex: calls from several goroutines are safe and
// run one after another. Different models run in parallel.
//
// Close frees the model's host memory. A finalizer closes a model that was
// not closed, but a model can hold many gigabytes, and one whose Log or
// Abort function refers to the model itself is never collected: close models
// explicitly.
type Model struct {
	mu     sync.Mutex
	c      *C.mt_model
	cb     *callbacks // nil without Log and Abort
	handle cgo.Handle // cb's, 0 without one
	vocab  uint32

	// A batch's ids are copied into C memory, since mt_batch points to them
	// and cgo forbids Go pointers inside memory passed to C. The buffer is
	// kept for the next call; the mutex guards it.
	buf    *C.int32_t
	bufLen int
}

// NewModel creates a model of shape cfg under pol (nil: the defaults) and
// initialises its weights from cfg.Seed. pol's Log and Abort stay in use
// until the model is closed.
func NewModel(cfg ModelConfig, pol *OffloadPolicy) (*Model, error) {
	if versionErr != nil {
		return nil, versionErr
	}
	ccfg := cfg.toC()
	var (
		cpol *C.mt_offload_policy
		cb   *callbacks
		h    cgo.Handle
	)
	if pol != nil {
		var (
			p       C.mt_offload_policy
			release func()
		)
		p, cb, h, release = pol.toC(true)
		defer release() // the library copies the device list
		cpol = &p
	}
	var cm *C.mt_model
	err := threadCall(func() C.mt_status { return C.mt_model_create(&cm, &ccfg, cpol) })
	if v, ok := cb.takePanic(); ok {
		C.mt_model_destroy(cm)
		h.Delete()
		panic(v)
	}
	if err != nil {
		if h != 0 {
			h.Delete()
		}
		return nil, err
	}
	m := &Model{c: cm, cb: cb, handle: h}
	var got C.mt_model_config
	C.mt_model_config_init(&got)
	if C.mt_model_get_config(cm, &got) == C.MT_OK {
		m.vocab = uint32(got.vocab_size)
	} else {
		m.vocab = cfg.VocabSize
	}
	runtime.SetFinalizer(m, (*Model).Close)
	return m, nil
}

// Close frees the model. Closing a closed model does nothing; other methods
// of a closed model fail with ErrInvalidArgument.
func (m *Model) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.c == nil {
		return nil
	}
	C.mt_model_destroy(m.c)
	m.c = nil
	v, panicked := m.cb.takePanic()
	if m.handle != 0 {
		m.handle.Delete()
		m.handle = 0
	}
	m.cb = nil
	if m.buf != nil {
		C.free(unsafe.Pointer(m.buf))
		m.buf, m.bufLen = nil, 0
	}
	runtime.SetFinalizer(m, nil)
	if panicked {
		panic(v)
	}
	return nil
}

func errClosed() error { return goError(StatusInvalidArgument, "the model is closed") }

// call runs f on the open model; m.mu must be held. The message of a
// failure is the model's own (mt_model_errmsg), which the mutex keeps from
// being overwritten before it is read.
func (m *Model) call(f func(c *C.mt_model) C.mt_status) error {
	if m.c == nil {
		return errClosed()
	}
	st := f(m.c)
	m.cb.rethrow()
	if st != C.MT_OK {
		return &Error{Status: Status(st), Message: C.GoString(C.mt_model_errmsg(m.c))}
	}
	return nil
}

// batchToC checks the slices against the shape, which the library cannot do
// with bare pointers, and copies them into the model's C buffer.
func (m *Model) batchToC(b *Batch) (C.mt_batch, error) {
	var cb C.mt_batch
	n := uint64(b.MicroBatchSize) * uint64(b.SeqLen) * uint64(b.NumMicroBatches)
	if uint64(len(b.Tokens)) != n || uint64(len(b.Targets)) != n || (b.Positions != nil && uint64(len(b.Positions)) != n) {
		return cb, goError(StatusInvalidArgument,
			"Batch holds %d tokens, %d targets and %d positions, but %d micro-batches of %d sequences of %d tokens are %d",
			len(b.Tokens), len(b.Targets), len(b.Positions), b.NumMicroBatches, b.MicroBatchSize, b.SeqLen, n)
	}
	arrays := 2
	if b.Positions != nil {
		arrays = 3
	}
	need := arrays * len(b.Tokens)
	if need == 0 {
		need = arrays // non-NULL pointers: the library refuses the empty shape itself
	}
	if m.bufLen < need {
		C.free(unsafe.Pointer(m.buf))
		m.buf, m.bufLen = nil, 0
		p := C.malloc(C.size_t(need) * C.size_t(unsafe.Sizeof(int32(0))))
		if p == nil {
			return cb, goError(StatusOutOfHostMemory, "cannot allocate %d token ids for the batch", need)
		}
		m.buf, m.bufLen = (*C.int32_t)(p), need
	}
	ids := unsafe.Slice((*int32)(unsafe.Pointer(m.buf)), need)
	per := need / arrays
	copy(ids, b.Tokens)
	copy(ids[per:], b.Targets)
	C.mt_batch_init(&cb)
	cb.micro_batch_size = C.uint32_t(b.MicroBatchSize)
	cb.seq_len = C.uint32_t(b.SeqLen)
	cb.num_micro_batches = C.uint32_t(b.NumMicroBatches)
	cb.tokens = m.buf
	cb.targets = (*C.int32_t)(unsafe.Pointer(&ids[per]))
	if b.Positions != nil {
		copy(ids[2*per:], b.Positions)
		cb.positions = (*C.int32_t)(unsafe.Pointer(&ids[2*per]))
	}
	return cb, nil
}

// Step takes one optimizer step on batch. On failure the model's weights,
// optimizer state and step count are as before; ErrNonFinite when the loss
// or gradient norm was not finite.
func (m *Model) Step(batch Batch, opt OptimConfig) (StepStats, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.c == nil {
		return StepStats{}, errClosed()
	}
	cb, err := m.batchToC(&batch)
	if err != nil {
		return StepStats{}, err
	}
	copt := opt.toC()
	var stats C.mt_step_stats
	C.mt_step_stats_init(&stats)
	if err := m.call(func(c *C.mt_model) C.mt_status { return C.mt_step(c, &cb, &copt, &stats) }); err != nil {
		return StepStats{}, err
	}
	return stepStatsFromC(&stats), nil
}

// Eval computes the loss of the model on batch without changing anything.
func (m *Model) Eval(batch Batch) (EvalStats, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.c == nil {
		return EvalStats{}, errClosed()
	}
	cb, err := m.batchToC(&batch)
	if err != nil {
		return EvalStats{}, err
	}
	var stats C.mt_eval_stats
	C.mt_eval_stats_init(&stats)
	if err := m.call(func(c *C.mt_model) C.mt_status { return C.mt_eval(c, &cb, &stats) }); err != nil {
		return EvalStats{}, err
	}
	return evalStatsFromC(&stats), nil
}

// int32Ptr points C at a slice's ids, which hold no Go pointers and may be
// passed directly; an empty slice gets a dummy element so that the library,
// not a NULL, reports the empty shape.
func int32Ptr(s []int32) *C.int32_t {
	if len(s) == 0 {
		s = make([]int32, 1)
	}
	return (*C.int32_t)(unsafe.Pointer(&s[0]))
}

// Logits returns the next-token scores after each of nSeq sequences of
// seqLen tokens: nSeq * vocabulary size floats, sequence after sequence.
func (m *Model) Logits(tokens []int32, nSeq, seqLen uint32) ([]float32, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.c == nil {
		return nil, errClosed()
	}
	if n := uint64(nSeq) * uint64(seqLen); uint64(len(tokens)) != n {
		return nil, goError(StatusInvalidArgument, "Logits got %d tokens, but %d sequences of %d tokens are %d",
			len(tokens), nSeq, seqLen, n)
	}
	out := make([]float32, int(nSeq)*int(m.vocab)+1) // +1: never empty, see int32Ptr
	if err := m.call(func(c *C.mt_model) C.mt_status {
		return C.mt_model_logits(c, int32Ptr(tokens), C.uint32_t(nSeq), C.uint32_t(seqLen), (*C.float)(unsafe.Pointer(&out[0])))
	}); err != nil {
		return nil, err
	}
	return out[:len(out)-1], nil
}

// pathCall runs f with dir as a C string.
func (m *Model) pathCall(dir string, f func(c *C.mt_model, dir *C.char) C.mt_status) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	cdir := C.CString(dir)
	defer C.free(unsafe.Pointer(cdir))
	return m.call(func(c *C.mt_model) C.mt_status { return f(c, cdir) })
}

// Save writes config.json and model.safetensors into dir, created if missing.
func (m *Model) Save(dir string) error {
	return m.pathCall(dir, func(c *C.mt_model, d *C.char) C.mt_status { return C.mt_model_save(c, d) })
}

// Load loads the weights of a Hugging Face model folder whose configuration
// matches the model's, and resets the optimizer state. On failure the model
// is as before.
func (m *Model) Load(dir string) error {
	return m.pathCall(dir, func(c *C.mt_model, d *C.char) C.mt_status { return C.mt_model_load(c, d) })
}

// CheckpointSave saves everything a bit-identical resume needs into
// dir/step-NNNNNNNN and points dir/latest at it. info may be nil.
func (m *Model) CheckpointSave(dir string, info *CheckpointInfo) error {
	var ci *C.mt_checkpoint_info
	if info != nil {
		c := info.toC()
		ci = &c
		defer C.free(unsafe.Pointer(c.caller_json))
	}
	return m.pathCall(dir, func(c *C.mt_model, d *C.char) C.mt_status { return C.mt_checkpoint_save(c, d, ci) })
}

// CheckpointLoad loads the checkpoint dir/latest names (or dir itself, a
// step folder): weights, optimizer state and step count, and returns what
// was saved with it. On failure the model is as before.
func (m *Model) CheckpointLoad(dir string) (CheckpointInfo, error) {
	var ci C.mt_checkpoint_info
	C.mt_checkpoint_info_init(&ci)
	var info CheckpointInfo
	// converted under the model's lock: caller_json lives until the next load
	if err := m.pathCall(dir, func(c *C.mt_model, d *C.char) C.mt_status {
		st := C.mt_checkpoint_load(c, d, &ci)
		if st == C.MT_OK {
			info = checkpointInfoFromC(&ci)
		}
		return st
	}); err != nil {
		return CheckpointInfo{}, err
	}
	return info, nil
}

// Config is the configuration the model was created with, HeadDim resolved.
func (m *Model) Config() (ModelConfig, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var cfg C.mt_model_config
	C.mt_model_config_init(&cfg)
	if err := m.call(func(c *C.mt_model) C.mt_status { return C.mt_model_get_config(c, &cfg) }); err != nil {
		return ModelConfig{}, err
	}
	return modelConfigFromC(&cfg), nil
}

// Timeline is the timeline of the model's last step with all its visits.
// ErrUnsupported unless the policy's Timeline is set and the backend is CUDA.
func (m *Model) Timeline() (Timeline, []TimelineVisit, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var tl C.mt_timeline
	C.mt_timeline_init(&tl)
	if err := m.call(func(c *C.mt_model) C.mt_status { return C.mt_model_timeline(c, &tl, nil, 0) }); err != nil {
		return Timeline{}, nil, err
	}
	// the mutex keeps the step, and so n_visits, the same for the second call
	cv := make([]C.mt_timeline_visit, int(tl.n_visits)+1)
	if err := m.call(func(c *C.mt_model) C.mt_status {
		return C.mt_model_timeline(c, &tl, &cv[0], tl.n_visits)
	}); err != nil {
		return Timeline{}, nil, err
	}
	visits := make([]TimelineVisit, tl.n_visits)
	for i := range visits {
		visits[i] = timelineVisitFromC(&cv[i])
	}
	return timelineFromC(&tl), visits, nil
}

// NumParams is the number of trainable parameters; 0 once closed.
func (m *Model) NumParams() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.c == nil {
		return 0
	}
	return uint64(C.mt_model_num_params(m.c))
}

// StepCount is the number of optimizer steps taken; 0 once closed.
func (m *Model) StepCount() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.c == nil {
		return 0
	}
	return uint64(C.mt_model_step_count(m.c))
}

// Backend is the backend in use, BackendCPU or BackendCUDA; BackendAuto once
// closed.
func (m *Model) Backend() Backend {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.c == nil {
		return BackendAuto
	}
	return Backend(C.mt_model_backend(m.c))
}
