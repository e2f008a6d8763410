// Package megatrain trains decoder-only transformer language models (Llama,
// Qwen2, Qwen3, Mistral, Phi-3 families) through libmegatrain, whose model
// state lives in host memory while the GPU receives one layer at a time.
//
// The package is a cgo binding found through pkg-config (package
// "megatrain"). Its API has no C types: option and result structs are plain
// Go structs, converted at each call, and option constructors (NewModelConfig,
// NewOffloadPolicy, ...) return the library's own defaults.
//
// Errors returned by the library are *Error values carrying a Status and the
// library's message; errors.Is(err, ErrInvalidArgument) and the other
// sentinels test the status.
//
// Concurrency: a Model is not safe for concurrent use in the library, so each
// Model holds a mutex and concurrent calls on it run one after another.
// Different models may be used from different goroutines at once. A Dataset
// is read-only after it is opened and may serve several goroutines.
package megatrain

// #cgo pkg-config: megatrain
// #include <megatrain.h>
//
// // The package is written against the 0.x API and uses fields first
// // released in 0.2 (mt_offload_policy.recompute, MT_WAIT_CAPACITY).
// #if MT_VERSION_MAJOR != 0 || MT_VERSION_MINOR < 2
// #error "package megatrain needs the libmegatrain 0.x header, 0.2 or later"
// #endif
import "C"

import (
	"fmt"
	"runtime"
)

// HeaderVersionMajor etc. are the version of the header this package was
// compiled against.
const (
	HeaderVersionMajor = C.MT_VERSION_MAJOR
	HeaderVersionMinor = C.MT_VERSION_MINOR
	HeaderVersionPatch = C.MT_VERSION_PATCH
)

// Version is the "MAJOR.MINOR.PATCH" of the library actually loaded.
func Version() string { return C.GoString(C.mt_version_string()) }

// VersionNumber is the loaded library's MAJOR*10000 + MINOR*100 + PATCH.
func VersionNumber() uint32 { return uint32(C.mt_version_number()) }

// versionErr is set when the loaded library's major version differs from the
// header's: its structs and calls may then mean something else, so every
// entry point that creates something refuses to run.
var versionErr error

func init() {
	if major := VersionNumber() / 10000; major != HeaderVersionMajor {
		versionErr = &Error{
			Status:  StatusUnsupported,
			Message: fmt.Sprintf("libmegatrain %s is loaded, but this package was built for %d.x", Version(), HeaderVersionMajor),
		}
	}
}

// CheckVersion reports whether the loaded library can serve this package;
// NewModel, OpenDataset, Plan and LoadConfig return the same error.
func CheckVersion() error { return versionErr }

// Status is a libmegatrain status code (mt_status).
type Status uint32

// The statuses of mt_status.
const (
	StatusOK              Status = C.MT_OK
	StatusInvalidArgument Status = C.MT_ERR_INVALID_ARGUMENT
	StatusStructSize      Status = C.MT_ERR_STRUCT_SIZE
	StatusOutOfHostMemory Status = C.MT_ERR_OUT_OF_HOST_MEMORY
	StatusHostBudget      Status = C.MT_ERR_HOST_BUDGET
	StatusGPUBudget       Status = C.MT_ERR_GPU_BUDGET
	StatusOutOfGPUMemory  Status = C.MT_ERR_OUT_OF_GPU_MEMORY
	StatusNoDevice        Status = C.MT_ERR_NO_DEVICE
	StatusDevice          Status = C.MT_ERR_DEVICE
	StatusIO              Status = C.MT_ERR_IO
	StatusFormat          Status = C.MT_ERR_FORMAT
	StatusUnsupported     Status = C.MT_ERR_UNSUPPORTED
	StatusNonFinite       Status = C.MT_ERR_NONFINITE
	StatusAborted         Status = C.MT_ERR_ABORTED
	StatusInternal        Status = C.MT_ERR_INTERNAL
)

// String is the library's English description of the status (mt_status_str).
func (s Status) String() string { return C.GoString(C.mt_status_str(C.mt_status(s))) }

// Error is a failed call: its status and the library's message.
type Error struct {
	Status  Status
	Message string
}

// Error formats as "<status string>: <message>".
func (e *Error) Error() string {
	if e.Message == "" {
		return e.Status.String()
	}
	return e.Status.String() + ": " + e.Message
}

// Is makes errors.Is(err, ErrX) test the status: a target *Error without a
// message (the sentinels below) matches every *Error of its status.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.Status == e.Status
}

// Sentinels for errors.Is, one per failure status.
var (
	ErrInvalidArgument = &Error{Status: StatusInvalidArgument}
	ErrStructSize      = &Error{Status: StatusStructSize}
	ErrOutOfHostMemory = &Error{Status: StatusOutOfHostMemory}
	ErrHostBudget      = &Error{Status: StatusHostBudget}
	ErrGPUBudget       = &Error{Status: StatusGPUBudget}
	ErrOutOfGPUMemory  = &Error{Status: StatusOutOfGPUMemory}
	ErrNoDevice        = &Error{Status: StatusNoDevice}
	ErrDevice          = &Error{Status: StatusDevice}
	ErrIO              = &Error{Status: StatusIO}
	ErrFormat          = &Error{Status: StatusFormat}
	ErrUnsupported     = &Error{Status: StatusUnsupported}
	ErrNonFinite       = &Error{Status: StatusNonFinite}
	ErrAborted         = &Error{Status: StatusAborted}
	ErrInternal        = &Error{Status: StatusInternal}
)

// threadCall runs a call whose message the library keeps per OS thread
// (mt_last_errmsg) and reads that message on the same thread: without the
// lock the goroutine could move between the call and the read and pick up
// another call's message.
func threadCall(f func() C.mt_status) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if st := f(); st != C.MT_OK {
		return &Error{Status: Status(st), Message: C.GoString(C.mt_last_errmsg())}
	}
	return nil
}

// goError is for failures the package finds before calling the library.
func goError(st Status, format string, args ...any) error {
	return &Error{Status: st, Message: fmt.Sprintf(format, args...)}
}
