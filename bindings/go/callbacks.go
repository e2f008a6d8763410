package megatrain

// This file holds the //export functions; cgo allows only declarations in
// the preamble of such a file, so the C trampolines live in types.go.

// #include <stdint.h>
import "C"

import (
	"runtime/cgo"
	"sync"
)

// callbacks is what a policy's log and abort hooks reach through their
// cgo.Handle. It lives as long as the model the policy created.
type callbacks struct {
	abort func() bool
	log   func(level LogLevel, text string)

	// A panic must not unwind through the library's C frames (it would
	// leave locks held and memory leaked), so a callback recovers it, keeps
	// it here, and the Go side of the call panics again once the library
	// has returned.
	mu       sync.Mutex
	panicked bool
	panicVal any
}

func (cb *callbacks) keepPanic(v any) {
	cb.mu.Lock()
	if !cb.panicked {
		cb.panicked, cb.panicVal = true, v
	}
	cb.mu.Unlock()
}

// takePanic returns a panic a callback recovered during the last call.
func (cb *callbacks) takePanic() (any, bool) {
	if cb == nil {
		return nil, false
	}
	cb.mu.Lock()
	defer cb.mu.Unlock()
	v, ok := cb.panicVal, cb.panicked
	cb.panicked, cb.panicVal = false, nil
	return v, ok
}

// rethrow panics again with a panic a callback recovered, if any.
func (cb *callbacks) rethrow() {
	if v, ok := cb.takePanic(); ok {
		panic(v)
	}
}

//export goMegatrainAbort
func goMegatrainAbort(h C.uintptr_t) (stop C.int) {
	cb := cgo.Handle(h).Value().(*callbacks)
	defer func() {
		if v := recover(); v != nil {
			cb.keepPanic(v)
			stop = 1 // stop the work: the caller is about to see the panic
		}
	}()
	if cb.abort != nil && cb.abort() {
		return 1
	}
	return 0
}

//export goMegatrainLog
func goMegatrainLog(level C.int, text *C.char, h C.uintptr_t) {
	cb := cgo.Handle(h).Value().(*callbacks)
	defer func() {
		if v := recover(); v != nil {
			cb.keepPanic(v)
		}
	}()
	if cb.log != nil {
		// copied: the text is only valid during the call
		cb.log(LogLevel(level), C.GoString(text))
	}
}
