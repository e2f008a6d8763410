package megatrain

// #include <megatrain.h>
// #include <stdlib.h>
import "C"

import (
	"runtime"
	"sync"
	"unsafe"
)

// Dataset is a memory-mapped token file cut into windows of SeqLen + 1
// tokens (mt_dataset). It is read-only after it is opened, so several
// goroutines may read it at once; the read lock only keeps Close from
// unmapping it under a read.
type Dataset struct {
	mu     sync.RWMutex
	c      *C.mt_dataset
	seqLen uint32
}

// OpenDataset opens and validates the token file at path. A file that cannot
// be opened gives ErrIO, a corrupt one ErrFormat.
func OpenDataset(path string, opt DatasetOptions) (*Dataset, error) {
	if versionErr != nil {
		return nil, versionErr
	}
	copt := opt.toC()
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var cd *C.mt_dataset
	if err := threadCall(func() C.mt_status { return C.mt_dataset_open(&cd, cpath, &copt) }); err != nil {
		return nil, err
	}
	d := &Dataset{c: cd, seqLen: opt.SeqLen}
	runtime.SetFinalizer(d, (*Dataset).Close)
	return d, nil
}

// Close unmaps the file. Closing a closed dataset does nothing.
func (d *Dataset) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.c != nil {
		C.mt_dataset_close(d.c)
		d.c = nil
		runtime.SetFinalizer(d, nil)
	}
	return nil
}

// SeqLen is the number of tokens of a sequence that Read returns.
func (d *Dataset) SeqLen() uint32 { return d.seqLen }

// NumTokens is the number of tokens in the file; 0 once closed.
func (d *Dataset) NumTokens() uint64 {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return uint64(C.mt_dataset_num_tokens(d.c)) // NULL once closed: 0
}

// NumWindows is the number of windows in split; 0 once closed.
func (d *Dataset) NumWindows(split Split) uint64 {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return uint64(C.mt_dataset_num_windows(d.c, C.mt_split(split)))
}

// Read returns nSeq sequences starting at window position of split, and the
// next token of each position as targets; the next read's position is
// position + nSeq. Training positions run on into the next epochs,
// held-out ones wrap.
func (d *Dataset) Read(split Split, position uint64, nSeq uint32) (tokens, targets []int32, err error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.c == nil {
		return nil, nil, goError(StatusInvalidArgument, "the dataset is closed")
	}
	n := int(nSeq) * int(d.seqLen)
	tokens, targets = make([]int32, n), make([]int32, n)
	// The library leaves the message of a failed read in mt_last_errmsg.
	err = threadCall(func() C.mt_status {
		return C.mt_dataset_read(d.c, C.mt_split(split), C.uint64_t(position), C.uint32_t(nSeq),
			int32Ptr(tokens), int32Ptr(targets))
	})
	if err != nil {
		return nil, nil, err
	}
	return tokens, targets, nil
}
