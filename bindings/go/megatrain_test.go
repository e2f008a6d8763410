package megatrain

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// The tests run on the CPU backend with the small model of
// examples/c/train.c, so they need no GPU and take seconds.

func smallConfig() ModelConfig {
	cfg := NewModelConfig()
	cfg.VocabSize = 32
	cfg.HiddenSize = 64
	cfg.IntermediateSize = 128
	cfg.NumHiddenLayers = 2
	cfg.NumAttentionHeads = 4
	cfg.NumKeyValueHeads = 2
	cfg.MaxPositionEmbeddings = 64
	cfg.Precision = PrecisionFP32
	return cfg
}

func cpuPolicy() OffloadPolicy {
	pol := NewOffloadPolicy()
	pol.Backend = BackendCPU
	pol.OptimizerThreads = 2
	return pol
}

func newModel(t *testing.T, pol OffloadPolicy) *Model {
	t.Helper()
	m, err := NewModel(smallConfig(), &pol)
	if err != nil {
		t.Fatalf("NewModel: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// patternBatch is examples/c/train.c's batch: 4 sequences of 32 tokens of a
// period-7 pattern.
func patternBatch() Batch {
	const nSeq, seqLen = 4, 32
	pattern := []int32{3, 17, 5, 29, 11, 2, 23}
	b := NewBatch()
	b.MicroBatchSize, b.SeqLen, b.NumMicroBatches = nSeq, seqLen, 1
	b.Tokens = make([]int32, nSeq*seqLen)
	b.Targets = make([]int32, nSeq*seqLen)
	for s := 0; s < nSeq; s++ {
		for i := 0; i < seqLen; i++ {
			b.Tokens[s*seqLen+i] = pattern[(s+i)%7]
			b.Targets[s*seqLen+i] = pattern[(s+i+1)%7]
		}
	}
	return b
}

func trainOpt() OptimConfig {
	opt := NewOptimConfig()
	opt.LR = 3e-3
	opt.TotalSteps = 60
	return opt
}

// wantStatus checks that err is an *Error of status st with a message.
func wantStatus(t *testing.T, err error, st Status, sentinel error) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("got %v (%T), want an *Error of status %d (%v)", err, err, st, st)
	}
	if e.Status != st {
		t.Fatalf("got status %d (%v), want %d (%v): %v", e.Status, e.Status, st, st, err)
	}
	if e.Message == "" {
		t.Fatalf("status %v came without a message", st)
	}
	if !errors.Is(err, sentinel) {
		t.Fatalf("errors.Is(%v, %v) is false", err, sentinel)
	}
	if got, want := e.Error(), st.String()+": "+e.Message; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
	return e
}

func TestVersion(t *testing.T) {
	if err := CheckVersion(); err != nil {
		t.Fatal(err)
	}
	n := VersionNumber()
	if n/10000 != HeaderVersionMajor {
		t.Fatalf("loaded major %d, header major %d", n/10000, HeaderVersionMajor)
	}
	if got, want := Version(), fmt.Sprintf("%d.%d.%d", n/10000, n/100%100, n%100); got != want {
		t.Fatalf("Version() = %q, VersionNumber() says %q", got, want)
	}
}

func TestStatusStrings(t *testing.T) {
	for s := StatusOK; s <= StatusInternal; s++ {
		if str := s.String(); str == "" || str == "unknown status" {
			t.Errorf("status %d has no description: %q", s, str)
		}
	}
	if got := StatusIO.String(); got != "I/O error" {
		t.Errorf("StatusIO.String() = %q", got)
	}
	if got := Status(1000).String(); got != "unknown status" {
		t.Errorf("Status(1000).String() = %q", got)
	}
	err := error(&Error{Status: StatusFormat, Message: "bad header"})
	if got := err.Error(); got != "bad file format: bad header" {
		t.Errorf("Error() = %q", got)
	}
	if !errors.Is(err, ErrFormat) || errors.Is(err, ErrIO) {
		t.Error("errors.Is does not follow the status")
	}
	if errors.Is(err, &Error{Status: StatusFormat, Message: "another"}) {
		t.Error("an *Error with a message matched as if it were a sentinel")
	}
}

// The constructors must return what the C init functions set
// (src/options.c, src/data.c and the header's comments).
func TestDefaults(t *testing.T) {
	wantCfg := ModelConfig{
		Arch: ArchLlama, VocabSize: 32000, HiddenSize: 512, IntermediateSize: 1408, NumHiddenLayers: 8,
		NumAttentionHeads: 8, NumKeyValueHeads: 8, HeadDim: 0, MaxPositionEmbeddings: 2048,
		RMSNormEps: 1e-5, RopeTheta: 10000, RopeScaling: RopeScalingNone, RopeFactor: 8,
		RopeLowFreqFactor: 1, RopeHighFreqFactor: 4, RopeOriginalMaxPosition: 8192,
		AttentionBias: false, TieWordEmbeddings: false, Precision: PrecisionBF16, Seed: 1,
		InitializerRange: 0.02, PadTokenID: -1,
	}
	if got := NewModelConfig(); got != wantCfg {
		t.Errorf("NewModelConfig() = %+v\nwant %+v", got, wantCfg)
	}
	pol := NewOffloadPolicy()
	if pol.Log != nil || pol.Abort != nil {
		t.Error("NewOffloadPolicy() set a callback")
	}
	pol.Log, pol.Abort = nil, nil
	wantPol := OffloadPolicy{
		Backend: BackendAuto, Device: 0, WeightSlots: 2, GPUBudgetBytes: 0, HostBudgetBytes: 0, NUMANode: -1,
		OptimizerThreads: 0, Activations: PlaceAuto, PinHost: PinAuto, LogLevel: LogWarn, Timeline: false,
		Recompute: RecomputeAuto,
	}
	if fmt.Sprintf("%+v", pol) != fmt.Sprintf("%+v", wantPol) {
		t.Errorf("NewOffloadPolicy() = %+v\nwant %+v", pol, wantPol)
	}
	wantOpt := OptimConfig{
		Schedule: LRCosine, LR: 3e-4, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, GradClip: 1,
		MinLRRatio: 0.1, WarmupSteps: 0, TotalSteps: 1000,
	}
	if got := NewOptimConfig(); got != wantOpt {
		t.Errorf("NewOptimConfig() = %+v\nwant %+v", got, wantOpt)
	}
	if got, want := NewBatchShape(), (BatchShape{MicroBatchSize: 1, SeqLen: 1024, NumMicroBatches: 1}); got != want {
		t.Errorf("NewBatchShape() = %+v, want %+v", got, want)
	}
	if got := NewBatch(); got.MicroBatchSize != 0 || got.SeqLen != 0 || got.NumMicroBatches != 0 ||
		got.Tokens != nil || got.Targets != nil {
		t.Errorf("NewBatch() = %+v, want all zero", got)
	}
	if got := NewCheckpointInfo(); got != (CheckpointInfo{}) {
		t.Errorf("NewCheckpointInfo() = %+v, want all zero", got)
	}
	wantDS := DatasetOptions{Format: TokensAuto, VocabSize: 0, SeqLen: 1024, HeldoutFraction: 0.01, Seed: 1}
	if got := NewDatasetOptions(); got != wantDS {
		t.Errorf("NewDatasetOptions() = %+v, want %+v", got, wantDS)
	}
	// The schedule of the default optimizer: no warm-up, so step 0 runs at lr.
	if got := NewOptimConfig().LRAt(0); got != 3e-4 {
		t.Errorf("LRAt(0) = %g, want 3e-4", got)
	}
	bad := NewOptimConfig()
	bad.LR = -1
	if got := bad.LRAt(0); !math.IsNaN(float64(got)) {
		t.Errorf("LRAt of an invalid config = %g, want NaN", got)
	}
}

func TestRefusedConfig(t *testing.T) {
	pol := cpuPolicy()
	bad := NewModelConfig()
	bad.NumAttentionHeads = 7 // the default 8 key/value heads do not divide it
	m, err := NewModel(bad, &pol)
	if m != nil {
		t.Fatal("a refused config returned a model")
	}
	e := wantStatus(t, err, StatusInvalidArgument, ErrInvalidArgument)
	if !strings.Contains(e.Message, "num_key_value_heads") {
		t.Errorf("the message does not name the field: %q", e.Message)
	}
	// a different status from the same path
	bad = smallConfig()
	bad.Arch = 99
	_, err = NewModel(bad, &pol)
	wantStatus(t, err, StatusInvalidArgument, ErrInvalidArgument)
}

// The device list reaches the library through C memory (it reads it during
// the call): one listed twice is refused by name, before any GPU is looked
// for.
func TestDeviceList(t *testing.T) {
	pol := NewOffloadPolicy()
	pol.Backend = BackendCUDA
	pol.Devices = []int32{1, 0, 1}
	_, err := NewModel(smallConfig(), &pol)
	e := wantStatus(t, err, StatusInvalidArgument, ErrInvalidArgument)
	if !strings.Contains(e.Message, "lists device 1 twice (entries 0 and 2)") {
		t.Errorf("the message does not name the device: %q", e.Message)
	}
}

// The weight fetch reaches the library: a value it does not know is refused
// by name; the default is FetchAuto.
func TestWeightFetch(t *testing.T) {
	pol := NewOffloadPolicy()
	if pol.WeightFetch != FetchAuto {
		t.Fatalf("default WeightFetch = %v, want FetchAuto", pol.WeightFetch)
	}
	pol.Backend = BackendCUDA
	pol.Devices = []int32{0, 1}
	pol.WeightFetch = 3
	_, err := NewModel(smallConfig(), &pol)
	e := wantStatus(t, err, StatusInvalidArgument, ErrInvalidArgument)
	if !strings.Contains(e.Message, "weight_fetch 3 is not an mt_weight_fetch") {
		t.Errorf("the message does not name the field: %q", e.Message)
	}
}

func TestCreateStepEval(t *testing.T) {
	m := newModel(t, cpuPolicy())
	if b := m.Backend(); b != BackendCPU {
		t.Fatalf("Backend() = %v, want CPU", b)
	}
	if n := m.NumParams(); n != 78144 {
		t.Fatalf("NumParams() = %d, want 78144 (examples/c/train.c)", n)
	}
	cfg, err := m.Config()
	if err != nil {
		t.Fatal(err)
	}
	want := smallConfig()
	want.HeadDim = want.HiddenSize / want.NumAttentionHeads // resolved by the library
	if cfg != want {
		t.Fatalf("Config() = %+v\nwant %+v", cfg, want)
	}

	batch, opt := patternBatch(), trainOpt()
	before, err := m.Eval(batch)
	if err != nil {
		t.Fatal(err)
	}
	if before.TargetTokens != uint64(len(batch.Targets)) || !(before.Loss > 0) {
		t.Fatalf("Eval = %+v", before)
	}
	var first StepStats
	for i := 0; i < 20; i++ {
		st, err := m.Step(batch, opt)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if i == 0 {
			first = st
		}
		if st.Step != uint64(i+1) {
			t.Fatalf("step %d reports Step %d", i, st.Step)
		}
	}
	// The first step's loss is examples/c/train.c's, and Eval saw the same
	// weights.
	if got := fmt.Sprintf("%.6f %.6f %.6f", first.Loss, first.GradNorm, first.LR); got != "3.493850 5.284866 0.003000" {
		t.Errorf("first step: loss, grad norm, lr = %s", got)
	}
	if math.Abs(before.Loss-first.Loss) > 1e-9 {
		t.Errorf("Eval loss %v, first step's loss %v", before.Loss, first.Loss)
	}
	if m.StepCount() != 20 {
		t.Fatalf("StepCount() = %d, want 20", m.StepCount())
	}
	after, err := m.Eval(batch)
	if err != nil {
		t.Fatal(err)
	}
	if !(after.Loss < 0.5*before.Loss) {
		t.Fatalf("the loss did not fall: %v -> %v", before.Loss, after.Loss)
	}
	if m.StepCount() != 20 {
		t.Fatal("Eval changed the step count")
	}

	// The model has learned the pattern: after 29, 11, 2 comes 23, after
	// 23, 3, 17 comes 5.
	logits, err := m.Logits([]int32{29, 11, 2, 23, 3, 17}, 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(logits) != 2*32 {
		t.Fatalf("Logits returned %d floats, want 64", len(logits))
	}
	argmax := func(v []float32) int {
		best := 0
		for i := range v {
			if v[i] > v[best] {
				best = i
			}
		}
		return best
	}
	if a, b := argmax(logits[:32]), argmax(logits[32:]); a != 23 || b != 5 {
		t.Errorf("predicted %d and %d after the sequences, want 23 and 5", a, b)
	}
	if _, err := m.Logits([]int32{1, 2, 3}, 2, 3); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Logits with too few tokens: %v", err)
	}
	if _, _, err := m.Timeline(); !errors.Is(err, ErrUnsupported) {
		t.Errorf("Timeline on the CPU backend: %v, want ErrUnsupported", err)
	}
}

func TestTokenOutOfRange(t *testing.T) {
	m := newModel(t, cpuPolicy())
	batch, opt := patternBatch(), trainOpt()
	if _, err := m.Step(batch, opt); err != nil {
		t.Fatal(err)
	}
	bad := patternBatch()
	bad.Tokens[37] = 32 // the vocabulary is [0, 32)
	_, err := m.Step(bad, opt)
	e := wantStatus(t, err, StatusInvalidArgument, ErrInvalidArgument)
	if !strings.Contains(e.Message, "32") {
		t.Errorf("the message does not name the token: %q", e.Message)
	}
	if n := m.StepCount(); n != 1 {
		t.Fatalf("StepCount() = %d after a refused step, want 1", n)
	}
	bad = patternBatch()
	bad.Targets[0] = -5
	if _, err := m.Eval(bad); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("a target out of range: %v", err)
	}
	// slices that do not match the shape are refused before the library
	// could read past them
	bad = patternBatch()
	bad.Tokens = bad.Tokens[:10]
	_, err = m.Step(bad, opt)
	wantStatus(t, err, StatusInvalidArgument, ErrInvalidArgument)
	// an empty shape is the library's to refuse
	_, err = m.Step(NewBatch(), opt)
	wantStatus(t, err, StatusInvalidArgument, ErrInvalidArgument)
	if n := m.StepCount(); n != 1 {
		t.Fatalf("StepCount() = %d after refused steps, want 1", n)
	}
	// and the model still trains
	if st, err := m.Step(batch, opt); err != nil || st.Step != 2 {
		t.Fatalf("the step after the refusals: %+v, %v", st, err)
	}
}

func TestCloseTwice(t *testing.T) {
	pol := cpuPolicy()
	m, err := NewModel(smallConfig(), &pol)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Step(patternBatch(), trainOpt()); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Step on a closed model: %v", err)
	}
	if _, err := m.Eval(patternBatch()); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Eval on a closed model: %v", err)
	}
	if err := m.Save(t.TempDir()); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Save on a closed model: %v", err)
	}
	if m.NumParams() != 0 || m.StepCount() != 0 || m.Backend() != BackendAuto {
		t.Fatal("a closed model reports a size, steps or a backend")
	}
}

func TestConcurrentSteps(t *testing.T) {
	m := newModel(t, cpuPolicy())
	batch, opt := patternBatch(), trainOpt()
	const goroutines, each = 4, 3
	var wg sync.WaitGroup
	errs := make(chan error, goroutines*each)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				if _, err := m.Step(batch, opt); err != nil {
					errs <- err
				}
				m.StepCount()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := m.StepCount(); n != goroutines*each {
		t.Fatalf("StepCount() = %d, want %d", n, goroutines*each)
	}
}

func TestPlan(t *testing.T) {
	cfg, pol := smallConfig(), cpuPolicy()
	p, err := Plan(cfg, &pol, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.NumParams != 78144 || p.Backend != BackendCPU || p.NumUnits != cfg.NumHiddenLayers+2 {
		t.Fatalf("Plan = %+v", p)
	}
	shape := BatchShape{MicroBatchSize: 4, SeqLen: 32, NumMicroBatches: 1}
	withBatch, err := Plan(cfg, &pol, &shape)
	if err != nil {
		t.Fatal(err)
	}
	if withBatch.ActivationBytes <= p.ActivationBytes && withBatch.WorkspaceBytes <= p.WorkspaceBytes {
		t.Errorf("a batch costs nothing: %+v vs %+v", withBatch, p)
	}
	pol.HostBudgetBytes = 4096
	p, err = Plan(cfg, &pol, nil)
	wantStatus(t, err, StatusHostBudget, ErrHostBudget)
	if p.NumParams != 78144 || p.HostBudgetBytes != 4096 {
		t.Errorf("a plan over budget was not filled in: %+v", p)
	}
	bad := smallConfig()
	bad.VocabSize = 1
	_, err = Plan(bad, nil, nil)
	wantStatus(t, err, StatusInvalidArgument, ErrInvalidArgument)
}

func TestSaveLoad(t *testing.T) {
	m := newModel(t, cpuPolicy())
	batch, opt := patternBatch(), trainOpt()
	for i := 0; i < 3; i++ {
		if _, err := m.Step(batch, opt); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(t.TempDir(), "model")
	if err := m.Save(dir); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(dir, NewModelConfig())
	if err != nil {
		t.Fatal(err)
	}
	if cfg.VocabSize != 32 || cfg.HiddenSize != 64 || cfg.NumKeyValueHeads != 2 || cfg.NumHiddenLayers != 2 {
		t.Fatalf("LoadConfig = %+v", cfg)
	}
	if _, err := LoadConfig(filepath.Join(dir, "missing"), NewModelConfig()); err == nil {
		t.Fatal("LoadConfig of a missing folder succeeded")
	} else if e := (*Error)(nil); !errors.As(err, &e) || e.Message == "" {
		t.Fatalf("LoadConfig of a missing folder: %v", err)
	}

	other := smallConfig()
	other.Seed = 7
	pol := cpuPolicy()
	m2, err := NewModel(other, &pol)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	if err := m2.Load(dir); err != nil {
		t.Fatal(err)
	}
	a, err := m.Eval(batch)
	if err != nil {
		t.Fatal(err)
	}
	b, err := m2.Eval(batch)
	if err != nil {
		t.Fatal(err)
	}
	if a.Loss != b.Loss {
		t.Fatalf("the loaded model's loss %v differs from the saved one's %v", b.Loss, a.Loss)
	}
	if err := m2.Load(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("Load of a missing folder succeeded")
	}
}

func TestCheckpoint(t *testing.T) {
	m := newModel(t, cpuPolicy())
	batch, opt := patternBatch(), trainOpt()
	for i := 0; i < 2; i++ {
		if _, err := m.Step(batch, opt); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	info := CheckpointInfo{Step: 99, DataPosition: 7, RNGState: [4]uint64{1, 2, 3, 1 << 63}, CallerJSON: `{"run":{"lr":0.003}}`}
	if err := m.CheckpointSave(dir, &info); err != nil {
		t.Fatal(err)
	}
	m2 := newModel(t, cpuPolicy())
	got, err := m2.CheckpointLoad(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := info
	want.Step = 2 // the model's, not the caller's
	if got != want {
		t.Fatalf("CheckpointLoad = %+v, want %+v", got, want)
	}
	if m2.StepCount() != 2 {
		t.Fatalf("StepCount() = %d after the load, want 2", m2.StepCount())
	}
	// a bit-identical resume
	s1, err := m.Step(batch, opt)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := m2.Step(batch, opt)
	if err != nil {
		t.Fatal(err)
	}
	if s1.Loss != s2.Loss || s1.GradNorm != s2.GradNorm || s1.Step != s2.Step {
		t.Fatalf("the resumed step differs: %+v vs %+v", s1, s2)
	}
	if _, err := m2.CheckpointLoad(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("CheckpointLoad of a missing folder succeeded")
	}
	if m2.StepCount() != 3 {
		t.Fatal("a failed CheckpointLoad changed the model")
	}
}

func TestDatasetMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing.bin")
	d, err := OpenDataset(path, NewDatasetOptions())
	if d != nil {
		t.Fatal("a missing file returned a dataset")
	}
	e := wantStatus(t, err, StatusIO, ErrIO)
	if !strings.Contains(e.Message, "missing.bin") {
		t.Errorf("the message does not name the file: %q", e.Message)
	}
}

func TestDataset(t *testing.T) {
	// 1000 raw uint16 tokens counting up modulo 32
	const n = 1000
	raw := make([]byte, 2*n)
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint16(raw[2*i:], uint16(i%32))
	}
	path := filepath.Join(t.TempDir(), "tokens.bin")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	opt := NewDatasetOptions()
	opt.Format = TokensU16
	opt.VocabSize = 32
	opt.SeqLen = 8
	opt.HeldoutFraction = 0.1
	d, err := OpenDataset(path, opt)
	if err != nil {
		t.Fatal(err)
	}
	if d.NumTokens() != n {
		t.Fatalf("NumTokens() = %d", d.NumTokens())
	}
	train, held := d.NumWindows(SplitTrain), d.NumWindows(SplitHeldout)
	if train == 0 || held == 0 || train+held > (n-1)/8 {
		t.Fatalf("NumWindows: %d train, %d held out", train, held)
	}
	for _, split := range []Split{SplitTrain, SplitHeldout} {
		tokens, targets, err := d.Read(split, 3, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(tokens) != 16 || len(targets) != 16 {
			t.Fatalf("Read returned %d tokens and %d targets", len(tokens), len(targets))
		}
		for i := range tokens {
			if targets[i] != (tokens[i]+1)%32 {
				t.Fatalf("split %d: target %d is not the token after %d", split, targets[i], tokens[i])
			}
		}
	}
	if _, _, err := d.Read(Split(7), 0, 1); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Read of an unknown split: %v", err)
	} else {
		wantStatus(t, err, StatusInvalidArgument, ErrInvalidArgument)
	}
	d.Close()
	d.Close()
	if d.NumTokens() != 0 {
		t.Fatal("a closed dataset reports tokens")
	}
	if _, _, err := d.Read(SplitTrain, 0, 1); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Read of a closed dataset: %v", err)
	}

	// ids past the vocabulary are refused at open
	opt.VocabSize = 16
	if _, err := OpenDataset(path, opt); err == nil {
		t.Fatal("a token past the vocabulary was accepted")
	}
}

func TestLogCallback(t *testing.T) {
	var mu sync.Mutex
	var lines []string
	pol := cpuPolicy()
	pol.LogLevel = LogInfo
	pol.Log = func(level LogLevel, text string) {
		mu.Lock()
		lines = append(lines, fmt.Sprintf("%d %s", level, text))
		mu.Unlock()
	}
	newModel(t, pol)
	mu.Lock()
	defer mu.Unlock()
	for _, l := range lines {
		if strings.HasPrefix(l, fmt.Sprintf("%d backend: CPU", LogInfo)) {
			return
		}
	}
	t.Fatalf("no backend line at info level among %q", lines)
}

func TestCallbackPanic(t *testing.T) {
	pol := cpuPolicy()
	pol.LogLevel = LogInfo
	pol.Log = func(LogLevel, string) { panic("from the log hook") }
	defer func() {
		if v := recover(); v != "from the log hook" {
			t.Fatalf("recovered %v, want the hook's panic", v)
		}
	}()
	m, _ := NewModel(smallConfig(), &pol)
	m.Close()
	t.Fatal("the hook's panic was lost")
}

// The library polls the abort hook between unit visits and micro-batches:
// a step it stops fails with ErrAborted and leaves the model as it was.
func TestAbort(t *testing.T) {
	var stop atomic.Bool
	var polls atomic.Int64
	pol := cpuPolicy()
	pol.Abort = func() bool {
		polls.Add(1)
		return stop.Load()
	}
	m := newModel(t, pol)
	batch, opt := patternBatch(), trainOpt()
	if _, err := m.Step(batch, opt); err != nil {
		t.Fatalf("a step without an abort: %v", err)
	}
	before, err := m.Eval(batch)
	if err != nil {
		t.Fatal(err)
	}
	stop.Store(true)
	polls.Store(0)
	_, err = m.Step(batch, opt)
	if polls.Load() == 0 {
		t.Errorf("the library never polled the abort hook during a step")
	}
	if err == nil {
		t.Fatal("the step was not aborted")
	}
	wantStatus(t, err, StatusAborted, ErrAborted)
	if _, err := m.Eval(batch); !errors.Is(err, ErrAborted) {
		t.Errorf("Eval with the hook set: %v, want ErrAborted", err)
	}
	if _, err := m.Logits(batch.Tokens, 4, 32); !errors.Is(err, ErrAborted) {
		t.Errorf("Logits with the hook set: %v, want ErrAborted", err)
	}
	if n := m.StepCount(); n != 1 {
		t.Fatalf("StepCount() = %d after an aborted step, want 1", n)
	}
	stop.Store(false)
	after, err := m.Eval(batch)
	if err != nil {
		t.Fatal(err)
	}
	if after.Loss != before.Loss {
		t.Fatalf("an aborted step changed the weights: loss %v -> %v", before.Loss, after.Loss)
	}
	if st, err := m.Step(batch, opt); err != nil || st.Step != 2 {
		t.Fatalf("the step after an abort: %+v, %v", st, err)
	}
}

func TestDocWriter(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "train.mt")
	w, err := CreateDocWriter(path, 100)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Append([]int32{1, 2, 3}, false); err != nil { // a prompt
		t.Fatal(err)
	}
	if err := w.Append([]int32{4, 5, 6, 7}, true); err != nil {
		t.Fatal(err)
	}
	if err := w.EndDocument(); err != nil {
		t.Fatal(err)
	}
	if err := w.AppendFlags([]int32{8, 9, 10}, []bool{true, true, false}); err != nil {
		t.Fatal(err)
	}
	if err := w.Append([]int32{100}, true); !errors.Is(err, ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "outside the vocabulary") {
		t.Fatalf("an id outside the vocabulary: %v", err)
	}
	if w.NumTokens() != 10 || w.NumTargets() != 6 || w.NumDocuments() != 1 {
		t.Fatalf("counts %d %d %d", w.NumTokens(), w.NumTargets(), w.NumDocuments())
	}
	if _, err := os.Stat(path); err == nil {
		t.Fatal("the file is under its name before Finish")
	}
	if err := w.Finish(); err != nil {
		t.Fatal(err)
	}
	opt := NewDatasetOptions()
	opt.Format, opt.VocabSize, opt.SeqLen, opt.HeldoutFraction = TokensDocs, 100, 8, 0
	d, err := OpenDataset(path, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.NumTokens() != 10 || d.NumWindows(SplitTrain) != 2 {
		t.Fatalf("read back %d tokens, %d windows", d.NumTokens(), d.NumWindows(SplitTrain))
	}

	// abandoned: nothing under the name, no temporary
	gone := filepath.Join(dir, "gone.mt")
	a, err := CreateDocWriter(gone, 100)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Append([]int32{1, 2}, true); err != nil {
		t.Fatal(err)
	}
	a.Close()
	for _, p := range []string{gone, gone + ".tmp"} {
		if _, err := os.Stat(p); err == nil {
			t.Fatalf("%s left behind", p)
		}
	}
	if _, err := CreateDocWriter(filepath.Join(dir, "nope", "x.mt"), 100); !errors.Is(err, ErrIO) {
		t.Fatalf("a missing folder: %v", err)
	}
}
