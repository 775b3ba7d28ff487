/* The torch-dict walk of `gpumemviz.fragmentation`, in C: one pass over every block.

   Why C: a report must read every block's size, state and requested size, and in Python the
   per-segment bookkeeping costs more than that reading itself; here the walk costs about what
   a bare Python loop that only reads the three values costs (benchmarks/analyze.py).

   walk(segments, small_page, large_page, careful) returns None, or a tuple of bytes holding
   native int64 (float64 for free_sq):
     seg_cols   SEG_COLS columns of len(segments) rows, column after column, in COL_* order
     free_sq    per segment, the sum of squared inactive block sizes, rounded once
     free_seg, free_off, free_size     inactive blocks: segment row, offset in it, size
     pend_seg, pend_off, pend_size     active_pending_free blocks, the same way
   None means "not the plain torch >= 2.1 shape this walk reads": a missing key, a value that
   is not an int (or, for is_expandable, a bool), an unknown state, a size that is negative or
   above 2^48, a 64-bit overflow. The Python walk (walk.py) then takes the file and names any
   real problem. Only exact dicts, lists, ints and strs are read; a dict key of another type
   could run Python code during a lookup, so every container is held while it is read.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* The first SUM_COLS columns are reduce.SUM_ROWS in its order: a device's figures are their sums */
enum {
    COL_TOTAL_SIZE, COL_ALLOCATED, COL_PENDING, COL_FREE, COL_REQUESTED, COL_N_BLOCKS,
    COL_TRAPPED, COL_RELEASABLE_DEFAULT, COL_RELEASABLE_PRIVATE, COL_STUCK_EXPANDABLE,
    COL_N_FREE, COL_N_PENDING, SUM_COLS,
    COL_ADDRESS = SUM_COLS, COL_LARGEST_FREE, COL_RELEASABLE, COL_STUCK, COL_FLAGS, COL_DEVICE,
    COL_STREAM, COL_POOL_A, COL_POOL_B, SEG_COLS
};
/* odd: a device, stream, pool or expandable flag other than the default;
   broken: the blocks do not add up to total_size */
enum { FLAG_SMALL = 1, FLAG_ODD = 2, FLAG_BROKEN = 4, FLAG_EXPANDABLE = 8 };

#define SMALL_BUFFER ((int64_t)2 << 20) /* kSmallBuffer: the size of small-pool segments */
#define MAX_SIZE ((int64_t)1 << 48)   /* sizes above this go to the Python walk */
#define MAX_TOTAL ((int64_t)1 << 62)  /* so that no running sum can overflow */

typedef struct {
    int64_t *data;
    Py_ssize_t len, cap;
} column_t;

static int push(column_t *c, int64_t v) {
    if (c->len == c->cap) {
        Py_ssize_t cap = c->cap ? c->cap * 2 : 256;
        int64_t *d = PyMem_Realloc(c->data, (size_t)cap * sizeof(int64_t));
        if (!d) {
            PyErr_NoMemory();
            return -1;
        }
        c->data = d;
        c->cap = cap;
    }
    c->data[c->len++] = v;
    return 0;
}

static PyObject *k_blocks, *k_address, *k_total_size, *k_segment_type, *k_device, *k_stream,
    *k_is_expandable, *k_segment_pool_id, *k_size, *k_state, *k_requested_size, *k_frames,
    *k_history, *k_real_size;

/* Results of the readers: OK, REFUSE (hand the file to the Python walk), ERROR (raised). */
enum { ERROR = -1, REFUSE = 0, OK = 1 };

static int int_value(PyObject *v, int64_t *out) {
    if (!PyLong_CheckExact(v)) return REFUSE;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow) return REFUSE;
    if (x == -1 && PyErr_Occurred()) return ERROR;
    *out = (int64_t)x;
    return OK;
}

static int read_int(PyObject *dict, PyObject *key, int64_t *out) {
    PyObject *v = PyDict_GetItemWithError(dict, key);
    if (!v) return PyErr_Occurred() ? ERROR : REFUSE;
    return int_value(v, out);
}

static int ascii_equals(PyObject *s, const char *text, Py_ssize_t n) {
    return PyUnicode_CheckExact(s) && PyUnicode_IS_COMPACT_ASCII(s) &&
           PyUnicode_GET_LENGTH(s) == n && memcmp(PyUnicode_DATA(s), text, (size_t)n) == 0;
}

/* A key the careful walk may miss (torch 2.0, bare lists): NULL in *out when it is absent and
   `optional`; REFUSE when it is absent otherwise. */
static int lookup(PyObject *dict, PyObject *key, int optional, PyObject **out) {
    *out = PyDict_GetItemWithError(dict, key);
    if (*out) return OK;
    if (PyErr_Occurred()) return ERROR;
    return optional ? OK : REFUSE;
}

static int read_optional_int(PyObject *dict, PyObject *key, int optional, int64_t *out) {
    PyObject *v;
    int rc = lookup(dict, key, optional, &v);
    if (rc != OK) return rc;
    *out = 0;
    return v ? int_value(v, out) : OK;
}

/* Where a segment lives: device, stream, expandable flag and private pool id (a tuple or list
   of two ints; (0, 0) is the default pool). In the careful mode (the Python walk's
   `_walk_careful`), absent keys take their defaults. */
typedef struct {
    int64_t device, stream, pool[2];
    int expandable;
} place_t;

static int read_place(PyObject *seg, int careful, place_t *p) {
    int rc = read_optional_int(seg, k_device, careful, &p->device);
    if (rc != OK) return rc;
    /* _walk_fast reads `device or stream or is_expandable or pool != (0, 0)` lazily: after a
       true one, a missing key is no KeyError there, so it is no refusal here either (else the
       careful mode, whose rules differ, would take a file _walk_fast reads) */
    if ((rc = read_optional_int(seg, k_stream, careful || p->device, &p->stream)) != OK)
        return rc;
    PyObject *exp, *pool;
    if ((rc = lookup(seg, k_is_expandable, careful || p->device || p->stream, &exp)) != OK)
        return rc;
    if (exp && exp != Py_True && exp != Py_False) return REFUSE;
    p->expandable = exp == Py_True;
    if ((rc = lookup(seg, k_segment_pool_id, careful || p->device || p->stream || p->expandable,
                     &pool)) != OK)
        return rc;
    p->pool[0] = p->pool[1] = 0;
    if (pool) {
        if (!(PyTuple_CheckExact(pool) || PyList_CheckExact(pool)) || Py_SIZE(pool) != 2)
            return REFUSE;
        for (int i = 0; i < 2; i++)
            if ((rc = int_value(PySequence_Fast_GET_ITEM(pool, i), &p->pool[i])) != OK) return rc;
    }
    return OK;
}

/* `_memory_viz._block_extra`, as walk._requested reads it in the careful mode: a block without
   frames (torch 2.0) takes the real_size of its first history entry, else its requested_size,
   else its size. */
static int read_requested(PyObject *b, int careful, int64_t size, int64_t *out) {
    if (!careful) return read_int(b, k_requested_size, out);
    PyObject *frames, *hist;
    int rc = lookup(b, k_frames, 1, &frames);
    if (rc != OK) return rc;
    if (frames) return read_int(b, k_requested_size, out);
    /* a requested_size the fast mode refuses is refused here too, even where history decides:
       this mode also reads files the fast mode handed back, which _walk_fast may still read */
    PyObject *req;
    int64_t requested = size;
    if ((rc = lookup(b, k_requested_size, 1, &req)) != OK) return rc;
    if (req) {
        if ((rc = read_int(b, k_requested_size, &requested)) != OK) return rc;
        if (requested < -MAX_SIZE || requested > MAX_SIZE) return REFUSE;
    }
    if ((rc = lookup(b, k_history, 1, &hist)) != OK) return rc;
    if (hist) {
        if (!PyList_CheckExact(hist)) return REFUSE;
        if (PyList_GET_SIZE(hist)) {
            PyObject *first = PyList_GET_ITEM(hist, 0);
            if (!PyDict_CheckExact(first)) return REFUSE;
            Py_INCREF(first); /* a key's __eq__ in the lookup could empty the history */
            rc = read_int(first, k_real_size, out);
            Py_DECREF(first);
            return rc;
        }
    }
    *out = requested; /* neither frames nor history: requested_size, else size */
    return OK;
}

typedef struct {
    Py_ssize_t n;
    int careful;                    /* the careful mode: see read_place and read_requested */
    int64_t small_page, large_page; /* mapping granularity of expandable segments */
    int64_t pages[2];               /* the last segment's whole free pages: small, large */
    int64_t base;                   /* the block sizes of the segments before: at most 2^62 */
    int64_t *cols;   /* SEG_COLS * n */
    double *free_sq; /* n */
    column_t blocks[6]; /* in B_* order */
} walk_t;

enum { B_FREE_SEG, B_FREE_OFF, B_FREE_SIZE, B_PEND_SEG, B_PEND_OFF, B_PEND_SIZE, B_COLUMNS };

typedef struct {
    int64_t alloc, free, pend, requested, largest, n_free, n_pend;
    int64_t run_begin;  /* offset where the current run of free and pending blocks began */
    int64_t run_end;    /* where it ends; no run while run_end < 0 */
    int64_t small_pages, large_pages; /* whole pages inside the runs (expandable segments) */
    unsigned __int128 free_sq; /* exact: sizes are below 2^48 */
} tally_t;

static int push_block(walk_t *w, int first, int64_t row, int64_t offset, int64_t size) {
    return push(&w->blocks[first], row) || push(&w->blocks[first + 1], offset) ||
           push(&w->blocks[first + 2], size);
}

/* Expandable segments return whole pages inside runs of free and pending-free blocks once the
   pending frees complete (reference 2.13); pages count from the segment's start. Both page
   sizes are tallied: the segment's pool is read after its blocks. */
static int64_t whole_pages(int64_t begin, int64_t end, int64_t page) {
    int64_t bytes = end / page * page - (begin + page - 1) / page * page;
    return bytes > 0 ? bytes : 0;
}

static void close_run(walk_t *w, tally_t *t) {
    if (t->run_end < 0) return;
    t->small_pages += whole_pages(t->run_begin, t->run_end, w->small_page);
    t->large_pages += whole_pages(t->run_begin, t->run_end, w->large_page);
    t->run_end = -1;
}

static void extend_run(tally_t *t, int64_t offset, int64_t size) {
    if (t->run_end < 0) t->run_begin = offset;
    t->run_end = offset + size;
}

static int walk_block(walk_t *w, Py_ssize_t row, PyObject *b, tally_t *t) {
    int64_t size, req;
    int rc = read_int(b, k_size, &size);
    if (rc != OK) return rc;
    if (size < 0 || size > MAX_SIZE) return REFUSE;
    PyObject *st = PyDict_GetItemWithError(b, k_state);
    if (!st) return PyErr_Occurred() ? ERROR : REFUSE;
    int64_t offset = t->alloc + t->free + t->pend;
    /* _walk_fast keeps every block's position in the whole file in an int64 */
    if (w->base + offset > MAX_TOTAL) return REFUSE;
    if (ascii_equals(st, "active_allocated", 16)) {
        if (size) close_run(w, t); /* a run goes on past an empty block, as reduce merges it */
        if ((rc = read_requested(b, w->careful, size, &req)) != OK) return rc;
        if (req < -MAX_SIZE || req > MAX_SIZE) return REFUSE;
        /* no int64 overflow: Python says where its sum overflows */
        if (t->requested > MAX_TOTAL || t->requested < -MAX_TOTAL) return REFUSE;
        t->alloc += size;
        t->requested += req;
    } else if (ascii_equals(st, "inactive", 8)) {
        if (push_block(w, B_FREE_SEG, row, offset, size)) return ERROR;
        t->free += size;
        t->n_free++;
        if (size > t->largest) t->largest = size;
        t->free_sq += (unsigned __int128)size * (unsigned __int128)size;
        extend_run(t, offset, size);
    } else if (ascii_equals(st, "active_pending_free", 19)) {
        if (push_block(w, B_PEND_SEG, row, offset, size)) return ERROR;
        t->pend += size;
        t->n_pend++;
        extend_run(t, offset, size);
    } else {
        return REFUSE;
    }
    return OK;
}

static int walk_blocks(walk_t *w, Py_ssize_t row, PyObject *blocks) {
    tally_t t;
    memset(&t, 0, sizeof t);
    t.run_end = -1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(blocks); i++) {
        PyObject *b = PyList_GET_ITEM(blocks, i);
        if (!PyDict_CheckExact(b)) return REFUSE;
        Py_INCREF(b);
        int rc = walk_block(w, row, b, &t);
        Py_DECREF(b);
        if (rc != OK) return rc;
    }
    close_run(w, &t);
    w->base += t.alloc + t.free + t.pend;
    if (w->base > MAX_TOTAL) return REFUSE;
    int64_t *c = w->cols;
    Py_ssize_t n = w->n;
    c[COL_REQUESTED * n + row] = t.requested;
    c[COL_N_BLOCKS * n + row] = PyList_GET_SIZE(blocks);
    c[COL_ALLOCATED * n + row] = t.alloc;
    c[COL_FREE * n + row] = t.free;
    c[COL_PENDING * n + row] = t.pend;
    c[COL_LARGEST_FREE * n + row] = t.largest;
    c[COL_N_FREE * n + row] = t.n_free;
    c[COL_N_PENDING * n + row] = t.n_pend;
    w->free_sq[row] = (double)t.free_sq; /* the exact sum rounded once, as float(int) rounds */
    w->pages[0] = t.small_pages;
    w->pages[1] = t.large_pages;
    return OK;
}

static int walk_segment(walk_t *w, Py_ssize_t row, PyObject *seg) {
    if (!PyDict_CheckExact(seg)) return REFUSE;
    PyObject *blocks = PyDict_GetItemWithError(seg, k_blocks);
    if (!blocks) return PyErr_Occurred() ? ERROR : REFUSE;
    if (!PyList_CheckExact(blocks)) return REFUSE;
    Py_INCREF(blocks);
    int rc = walk_blocks(w, row, blocks);
    Py_DECREF(blocks);
    if (rc != OK) return rc;
    int64_t address, total;
    if ((rc = read_int(seg, k_address, &address)) != OK) return rc;
    if ((rc = read_int(seg, k_total_size, &total)) != OK) return rc;
    if (total < 0 || total > MAX_TOTAL) return REFUSE;
    PyObject *type;
    if ((rc = lookup(seg, k_segment_type, w->careful, &type)) != OK) return rc;
    /* decided before the next lookups (which may run a key's __eq__ and free it). Only a plain
       str is compared here; without one, torch 2.0 files (the careful mode) take small segments
       to be the 2 MiB ones, while _walk_fast's `None == "small"` is false */
    int small;
    if (type && type != Py_None) {
        if (!PyUnicode_CheckExact(type)) return REFUSE;
        small = ascii_equals(type, "small", 5);
    } else {
        small = w->careful && total == SMALL_BUFFER;
    }
    place_t place;
    if ((rc = read_place(seg, w->careful, &place)) != OK) return rc;
    int expandable = place.expandable, default_pool = !place.pool[0] && !place.pool[1];
    int odd = place.device || place.stream || expandable || !default_pool;
    Py_ssize_t n = w->n;
    int64_t *c = w->cols;
#define AT(col) c[(col) * n + row]
    int64_t alloc = AT(COL_ALLOCATED), free = AT(COL_FREE), pend = AT(COL_PENDING);
    /* what empty_cache returns: whole segments with nothing allocated (it syncs pending frees
       first), or the whole free pages of an expandable segment */
    int64_t releasable = expandable ? w->pages[small ? 0 : 1] : (alloc == 0 ? total : 0);
    int64_t stuck = free + pend - releasable;
    if (stuck < 0) stuck = 0;
    AT(COL_TOTAL_SIZE) = total;
    AT(COL_TRAPPED) = alloc > 0 && !expandable ? free : 0;
    AT(COL_RELEASABLE_DEFAULT) = default_pool ? releasable : 0;
    AT(COL_RELEASABLE_PRIVATE) = default_pool ? 0 : releasable;
    AT(COL_STUCK_EXPANDABLE) = expandable && default_pool ? stuck : 0;
    AT(COL_ADDRESS) = address;
    AT(COL_RELEASABLE) = releasable;
    AT(COL_STUCK) = stuck;
    AT(COL_FLAGS) = (small ? FLAG_SMALL : 0) | (odd ? FLAG_ODD : 0) |
                    (alloc + pend + free != total ? FLAG_BROKEN : 0) |
                    (expandable ? FLAG_EXPANDABLE : 0);
    AT(COL_DEVICE) = place.device;
    AT(COL_STREAM) = place.stream;
    AT(COL_POOL_A) = place.pool[0];
    AT(COL_POOL_B) = place.pool[1];
#undef AT
    return OK;
}

static PyObject *as_bytes(const void *data, Py_ssize_t count, Py_ssize_t item) {
    return PyBytes_FromStringAndSize(count ? (const char *)data : "", count * item);
}

static PyObject *walk(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *segs;
    long long small_page, large_page;
    int careful;
    if (!PyArg_ParseTuple(args, "OLLp:walk", &segs, &small_page, &large_page, &careful))
        return NULL;
    if (!PyList_CheckExact(segs) || small_page <= 0 || large_page <= 0) Py_RETURN_NONE;
    walk_t w;
    memset(&w, 0, sizeof w);
    w.careful = careful;
    w.small_page = small_page;
    w.large_page = large_page;
    w.n = PyList_GET_SIZE(segs);
    PyObject *out = NULL;
    w.cols = PyMem_Calloc((size_t)(w.n * SEG_COLS + 1), sizeof(int64_t));
    w.free_sq = PyMem_Calloc((size_t)(w.n + 1), sizeof(double));
    if (!w.cols || !w.free_sq) {
        PyErr_NoMemory();
        goto done;
    }
    int rc = OK;
    Py_INCREF(segs);
    for (Py_ssize_t row = 0; row < w.n && rc == OK; row++) {
        if (row >= PyList_GET_SIZE(segs)) {
            rc = REFUSE; /* the list shrank while it was read */
            break;
        }
        PyObject *seg = PyList_GET_ITEM(segs, row);
        Py_INCREF(seg);
        rc = walk_segment(&w, row, seg);
        Py_DECREF(seg);
    }
    if (rc == OK && PyList_GET_SIZE(segs) != w.n) rc = REFUSE;
    Py_DECREF(segs);
    if (rc == REFUSE) {
        out = Py_None;
        Py_INCREF(out);
    } else if (rc == OK && (out = PyTuple_New(2 + B_COLUMNS))) {
        PyTuple_SET_ITEM(out, 0, as_bytes(w.cols, w.n * SEG_COLS, 8));
        PyTuple_SET_ITEM(out, 1, as_bytes(w.free_sq, w.n, 8));
        for (int i = 0; i < B_COLUMNS; i++)
            PyTuple_SET_ITEM(out, 2 + i, as_bytes(w.blocks[i].data, w.blocks[i].len, 8));
        for (int i = 0; i < 2 + B_COLUMNS; i++) {
            if (!PyTuple_GET_ITEM(out, i)) { /* out of memory: a tuple may hold NULLs */
                Py_CLEAR(out);
                break;
            }
        }
    }
done:
    PyMem_Free(w.cols);
    PyMem_Free(w.free_sq);
    for (int i = 0; i < B_COLUMNS; i++) PyMem_Free(w.blocks[i].data);
    return out;
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS,
     "walk(segments, small_page, large_page, careful) -> bytes columns, or None (_cwalk.c)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cwalk", "The torch-dict walk of gpumemviz.fragmentation, in C.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__cwalk(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    /* walk.py checks both: VERSION changes with the contract, SEG_COLS with the columns */
    if (PyModule_AddIntConstant(m, "VERSION", 4) < 0) return NULL;
    if (PyModule_AddIntConstant(m, "SEG_COLS", SEG_COLS) < 0) return NULL;
#define KEY(var, text) \
    if (!(var = PyUnicode_InternFromString(text))) return NULL
    KEY(k_blocks, "blocks");
    KEY(k_address, "address");
    KEY(k_total_size, "total_size");
    KEY(k_segment_type, "segment_type");
    KEY(k_device, "device");
    KEY(k_stream, "stream");
    KEY(k_is_expandable, "is_expandable");
    KEY(k_segment_pool_id, "segment_pool_id");
    KEY(k_size, "size");
    KEY(k_state, "state");
    KEY(k_requested_size, "requested_size");
    KEY(k_frames, "frames");
    KEY(k_history, "history");
    KEY(k_real_size, "real_size");
#undef KEY
    return m;
}
