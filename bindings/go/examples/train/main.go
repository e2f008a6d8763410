// Command train trains a small model on a repeating token pattern through
// package megatrain: the same run as examples/c/train.c, printing the same
// lines after the first.
//
//	go run ./examples/train    (PKG_CONFIG_PATH set to the install's lib/pkgconfig)
//
// Exits 0 when the loss fell to under half its first value.
package main

import (
	"fmt"
	"os"

	"libmegatrain/go/megatrain"
)

const (
	nSeq   = 4
	seqLen = 32
	steps  = 60
)

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

func main() {
	fmt.Printf("libmegatrain %s from Go\n", megatrain.Version())

	cfg := megatrain.NewModelConfig()
	cfg.VocabSize = 32
	cfg.HiddenSize = 64
	cfg.IntermediateSize = 128
	cfg.NumHiddenLayers = 2
	cfg.NumAttentionHeads = 4
	cfg.NumKeyValueHeads = 2
	cfg.MaxPositionEmbeddings = 64
	cfg.Precision = megatrain.PrecisionFP32
	pol := megatrain.NewOffloadPolicy()
	pol.Backend = megatrain.BackendCPU

	// a refusal first: 7 query heads, which the default 8 key/value heads do not divide
	bad := megatrain.NewModelConfig()
	bad.NumAttentionHeads = 7
	if m, err := megatrain.NewModel(bad, &pol); err == nil {
		m.Close()
		fail("a bad config was not refused")
	} else if e, ok := err.(*megatrain.Error); !ok || e.Message == "" {
		fail("a bad config was not refused with a message (%v)", err)
	} else {
		fmt.Printf("refused as expected: %v\n", err)
	}

	model, err := megatrain.NewModel(cfg, &pol)
	if err != nil {
		fail("NewModel: %v", err)
	}
	defer model.Close()
	fmt.Printf("%d parameters\n", model.NumParams())

	// 4 sequences of 32 tokens of a period-7 pattern, each starting elsewhere in it
	pattern := []int32{3, 17, 5, 29, 11, 2, 23}
	batch := megatrain.NewBatch()
	batch.MicroBatchSize = nSeq
	batch.SeqLen = seqLen
	batch.NumMicroBatches = 1
	batch.Tokens = make([]int32, nSeq*seqLen)
	batch.Targets = make([]int32, nSeq*seqLen)
	for s := 0; s < nSeq; s++ {
		for t := 0; t < seqLen; t++ {
			batch.Tokens[s*seqLen+t] = pattern[(s+t)%7]
			batch.Targets[s*seqLen+t] = pattern[(s+t+1)%7]
		}
	}
	opt := megatrain.NewOptimConfig()
	opt.LR = 3e-3
	opt.TotalSteps = steps

	var first, last float64
	for i := 0; i < steps; i++ {
		stats, err := model.Step(batch, opt)
		if err != nil {
			model.Close() // os.Exit skips the deferred Close
			fail("Step: %v", err)
		}
		if i == 0 {
			first = stats.Loss
		}
		last = stats.Loss
		if i%20 == 0 || i == steps-1 {
			fmt.Printf("step %2d: loss %.6f, grad norm %.6f, lr %.6f\n", stats.Step, stats.Loss, stats.GradNorm,
				float64(stats.LR))
		}
	}
	if !(last < 0.5*first) {
		model.Close()
		fail("the loss did not fall to half: %.4f -> %.4f", first, last)
	}
	fmt.Printf("learned: loss %.6f -> %.6f\n", first, last)
}
