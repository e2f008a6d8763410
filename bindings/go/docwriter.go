package megatrain

// #include <megatrain.h>
// #include <stdlib.h>
import "C"

import (
	"runtime"
	"sync"
	"unsafe"
)

// DocWriter writes a document file (TokensDocs, mt_doc_writer): documents of
// token ids, each token learnt or not. The file appears under its path only
// when Finish succeeds; closed unfinished, it leaves nothing behind. Its
// methods may be called from any goroutine; a lock makes them one at a time.
type DocWriter struct {
	mu sync.Mutex
	c  *C.mt_doc_writer
}

// CreateDocWriter starts a document file at path for ids below vocabSize.
// A folder that does not exist gives ErrIO.
func CreateDocWriter(path string, vocabSize uint32) (*DocWriter, error) {
	if versionErr != nil {
		return nil, versionErr
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var cw *C.mt_doc_writer
	if err := threadCall(func() C.mt_status { return C.mt_doc_writer_create(&cw, cpath, C.uint32_t(vocabSize)) }); err != nil {
		return nil, err
	}
	w := &DocWriter{c: cw}
	runtime.SetFinalizer(w, (*DocWriter).Close)
	return w, nil
}

// Append adds tokens to the current document, all learnt (learnt true) or none.
func (w *DocWriter) Append(tokens []int32, learnt bool) error {
	flags := make([]bool, len(tokens))
	for i := range flags {
		flags[i] = learnt
	}
	return w.AppendFlags(tokens, flags)
}

// AppendFlags adds tokens with a flag each: true for a token the model learns.
func (w *DocWriter) AppendFlags(tokens []int32, learnt []bool) error {
	if len(learnt) != len(tokens) {
		return goError(StatusInvalidArgument, "DocWriter.AppendFlags: %d tokens and %d flags", len(tokens), len(learnt))
	}
	flags := make([]uint8, len(tokens)+1) // never empty, so &flags[0] exists
	for i, l := range learnt {
		if l {
			flags[i] = 1
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.c == nil {
		return goError(StatusInvalidArgument, "the document writer is closed")
	}
	return threadCall(func() C.mt_status {
		return C.mt_doc_writer_append(w.c, int32Ptr(tokens), (*C.uint8_t)(unsafe.Pointer(&flags[0])), C.size_t(len(tokens)))
	})
}

// EndDocument ends the current document (an empty one is none).
func (w *DocWriter) EndDocument() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.c == nil {
		return goError(StatusInvalidArgument, "the document writer is closed")
	}
	return threadCall(func() C.mt_status { return C.mt_doc_writer_end_document(w.c) })
}

// Finish ends the last document and puts the file under its path.
func (w *DocWriter) Finish() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.c == nil {
		return goError(StatusInvalidArgument, "the document writer is closed")
	}
	return threadCall(func() C.mt_status { return C.mt_doc_writer_finish(w.c) })
}

// Counts so far: tokens, learnt tokens, ended documents; 0 once closed.
func (w *DocWriter) NumTokens() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return uint64(C.mt_doc_writer_num_tokens(w.c))
}

func (w *DocWriter) NumTargets() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return uint64(C.mt_doc_writer_num_targets(w.c))
}

func (w *DocWriter) NumDocuments() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return uint64(C.mt_doc_writer_num_documents(w.c))
}

// Close frees the writer; an unfinished file is removed. Closing twice does nothing.
func (w *DocWriter) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.c != nil {
		C.mt_doc_writer_free(w.c)
		w.c = nil
		runtime.SetFinalizer(w, nil)
	}
	return nil
}
