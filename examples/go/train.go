// Trains a small model on a repeating token pattern through libmegatrain's C
// API from Go, with cgo and pkg-config: the same run as examples/rust and
// the same losses, a check that the library works from a Go program. The
// header's mt_X_init functions are static inline; cgo compiles the preamble
// that includes them, so Go calls them like any other.
//
//	go run train.go        (PKG_CONFIG_PATH set to the install's lib/pkgconfig)
//
// Exits 0 when the loss fell to under half its first value.
package main

// #cgo pkg-config: megatrain
// #include <megatrain.h>
// #include <stdlib.h>
import "C"

import (
	"fmt"
	"os"
	"unsafe"
)

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

func main() {
	fmt.Printf("libmegatrain %s from Go\n", C.GoString(C.mt_version_string()))

	var cfg C.mt_model_config
	C.mt_model_config_init(&cfg)
	cfg.vocab_size = 32
	cfg.hidden_size = 64
	cfg.intermediate_size = 128
	cfg.num_hidden_layers = 2
	cfg.num_attention_heads = 4
	cfg.num_key_value_heads = 2
	cfg.max_position_embeddings = 64
	cfg.precision = C.MT_PRECISION_FP32
	var pol C.mt_offload_policy
	C.mt_offload_policy_init(&pol)
	pol.backend = C.MT_BACKEND_CPU

	// a refusal first: 7 query heads, which the default 8 key/value heads do not divide
	var bad C.mt_model_config
	C.mt_model_config_init(&bad)
	bad.num_attention_heads = 7
	var model *C.mt_model
	if st := C.mt_model_create(&model, &bad, &pol); st == C.MT_OK || model != nil || C.GoString(C.mt_last_errmsg()) == "" {
		fail("a bad config was not refused with a message (%d)", int(st))
	} else {
		fmt.Printf("refused as expected: %s: %s\n", C.GoString(C.mt_status_str(st)), C.GoString(C.mt_last_errmsg()))
	}

	if st := C.mt_model_create(&model, &cfg, &pol); st != C.MT_OK {
		fail("mt_model_create: %s: %s", C.GoString(C.mt_status_str(st)), C.GoString(C.mt_last_errmsg()))
	}
	defer C.mt_model_destroy(model)
	fmt.Printf("%d parameters\n", uint64(C.mt_model_num_params(model)))

	// 4 sequences of 32 tokens of a period-7 pattern, each starting elsewhere in it.
	// The ids live in C memory: mt_batch points to them, and cgo lets Go memory
	// passed to C hold C pointers but not Go ones.
	const nSeq, seqLen = 4, 32
	pattern := []int32{3, 17, 5, 29, 11, 2, 23}
	n := C.size_t(nSeq * seqLen * 4)
	tokens := (*[nSeq * seqLen]C.int32_t)(C.malloc(n))
	targets := (*[nSeq * seqLen]C.int32_t)(C.malloc(n))
	defer C.free(unsafe.Pointer(tokens))
	defer C.free(unsafe.Pointer(targets))
	for s := 0; s < nSeq; s++ {
		for t := 0; t < seqLen; t++ {
			tokens[s*seqLen+t] = C.int32_t(pattern[(s+t)%7])
			targets[s*seqLen+t] = C.int32_t(pattern[(s+t+1)%7])
		}
	}
	var batch C.mt_batch
	C.mt_batch_init(&batch)
	batch.micro_batch_size = nSeq
	batch.seq_len = seqLen
	batch.num_micro_batches = 1
	batch.tokens = &tokens[0]
	batch.targets = &targets[0]
	var opt C.mt_optim_config
	C.mt_optim_config_init(&opt)
	opt.lr = 3e-3
	opt.total_steps = 60

	var first, last float64
	for i := 0; i < 60; i++ {
		var stats C.mt_step_stats
		C.mt_step_stats_init(&stats)
		if st := C.mt_step(model, &batch, &opt, &stats); st != C.MT_OK {
			fail("mt_step: %s: %s", C.GoString(C.mt_status_str(st)), C.GoString(C.mt_model_errmsg(model)))
		}
		if i == 0 {
			first = float64(stats.loss)
		}
		last = float64(stats.loss)
		if i%20 == 0 || i == 59 {
			fmt.Printf("step %2d: loss %.6f, grad norm %.6f, lr %.6f\n", uint64(stats.step), float64(stats.loss),
				float64(stats.grad_norm), float64(stats.lr))
		}
	}
	if !(last < 0.5*first) {
		fail("the loss did not fall to half: %.4f -> %.4f", first, last)
	}
	fmt.Printf("learned: loss %.6f -> %.6f\n", first, last)
}
