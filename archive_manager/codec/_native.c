/* The codec's numeric-list conversion in C (docs/architecture/samples-and-values.md, "Native list
 * conversion").
 *
 * numbers(list) turns a list of exact ints (within int64) or exact floats into exactly the
 * (dtype name, bytes, shuffled) that the pure-Python path of archive_manager.codec.values
 * writes: the same exact-type checks (a bool, an int or float subclass, a numpy scalar is
 * not a number here), the same lossless narrowing, the same byte planes.  Anything else
 * returns None and the Python path decides.  No Python code runs while the list is read
 * (only exact ints and floats are looked at), so the list cannot change under the loop.
 *
 * texts_holding(parts, needle, folded, also) is the search's prefilter
 * (docs/architecture/search.md, "Search"): which of a chunk's text parts hold the needle's bytes,
 * searched without the GIL.
 *
 * hand_over(budget_ns) lets another thread take the GIL without a timed sleep
 * (docs/architecture/save-protocol.md, "Handing the GIL over").
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <float.h>
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The narrowing order of values._INT_NARROWING: the first that holds [lo, hi] wins. */
static const struct {
    const char *name;
    int64_t lo;
    int64_t hi;
    int width;
} NARROWING[] = {
    {"int8", INT8_MIN, INT8_MAX, 1},      {"uint8", 0, UINT8_MAX, 1},
    {"int16", INT16_MIN, INT16_MAX, 2},   {"uint16", 0, UINT16_MAX, 2},
    {"int32", INT32_MIN, INT32_MAX, 4},   {"uint32", 0, UINT32_MAX, 4},
    {"int64", INT64_MIN, INT64_MAX, 8},
};
#define N_NARROWING (sizeof(NARROWING) / sizeof(NARROWING[0]))

/* Byte plane j of the result holds byte j (little-endian) of every item: the layout of
 * values._shuffled, whether or not the flag says shuffled (one item or one-byte items
 * lay out the same either way). */
static void
planes(unsigned char *out, const uint64_t *bits, Py_ssize_t n, int width)
{
    for (int j = 0; j < width; j++) {
        unsigned char *plane = out + (Py_ssize_t)j * n;
        const int shift = 8 * j;
        for (Py_ssize_t i = 0; i < n; i++) {
            plane[i] = (unsigned char)(bits[i] >> shift);
        }
    }
}

/* planes() of 4-byte items held as such (float32 bits). */
static void
planes32(unsigned char *out, const uint32_t *items, Py_ssize_t n)
{
    for (int j = 0; j < 4; j++) {
        unsigned char *plane = out + (Py_ssize_t)j * n;
        const int shift = 8 * j;
        for (Py_ssize_t i = 0; i < n; i++) {
            plane[i] = (unsigned char)(items[i] >> shift);
        }
    }
}

static PyObject *
result(const char *name, const uint64_t *bits, Py_ssize_t n, int width)
{
    PyObject *data = PyBytes_FromStringAndSize(NULL, n * width);
    if (data == NULL) {
        return NULL;
    }
    planes((unsigned char *)PyBytes_AS_STRING(data), bits, n, width);
    /* values._shuffled: shuffled only when wider than a byte and more than one item */
    PyObject *shuffled = (width > 1 && n > 1) ? Py_True : Py_False;
    return Py_BuildValue("(sNO)", name, data, shuffled);
}

/* An exact int's value when CPython keeps it in one machine digit (every token id, mask and
 * length: |v| < 2**30): read in place, without the call and overflow checks of
 * PyLong_AsLongLongAndOverflow, which the caller falls back to.  1 if read. */
static inline int
compact_value(PyObject *item, long long *v)
{
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)item)) {
        *v = (long long)PyUnstable_Long_CompactValue((PyLongObject *)item);
        return 1;
    }
    return 0;
#else
    Py_ssize_t size = Py_SIZE(item);
    if (size >= -1 && size <= 1) {
        *v = (long long)size * (long long)((PyLongObject *)item)->ob_digit[0];
        return 1;
    }
    return 0;
#endif
}

static PyObject *
ints(PyObject *list, Py_ssize_t n, uint64_t *bits)
{
    PyObject **items = PySequence_Fast_ITEMS(list);
    int64_t lo = 0, hi = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = items[i];
        if (!PyLong_CheckExact(item)) {
            Py_RETURN_NONE;
        }
        long long v;
        if (!compact_value(item, &v)) {
            int overflow = 0;
            v = PyLong_AsLongLongAndOverflow(item, &overflow);
            if (overflow) {
                Py_RETURN_NONE; /* beyond int64: JSON keeps any size exact */
            }
            if (v == -1 && PyErr_Occurred()) {
                return NULL;
            }
        }
        if (i == 0 || v < lo) {
            lo = v;
        }
        if (i == 0 || v > hi) {
            hi = v;
        }
        bits[i] = (uint64_t)v;
    }
    for (size_t k = 0; k < N_NARROWING; k++) {
        if (NARROWING[k].lo <= lo && hi <= NARROWING[k].hi) {
            return result(NARROWING[k].name, bits, n, NARROWING[k].width);
        }
    }
    return result("int64", bits, n, 8); /* not reached: int64 holds every value read */
}

/* Whether d survives float64 -> float32 -> float64 bit for bit (NaN payloads, -0.0, inf),
 * through the same hardware conversion numpy's astype uses. */
static int
exact_single(double d, uint32_t *single)
{
    if (isfinite(d) && fabs(d) > FLT_MAX) {
        return 0; /* would round to inf */
    }
    float f = (float)d;
    double back = (double)f;
    uint64_t a, b;
    memcpy(&a, &d, 8);
    memcpy(&b, &back, 8);
    memcpy(single, &f, 4);
    return a == b;
}

static PyObject *
floats(PyObject *list, Py_ssize_t n, uint64_t *bits)
{
    PyObject **items = PySequence_Fast_ITEMS(list);
    int all_single = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = items[i];
        if (!PyFloat_CheckExact(item)) {
            Py_RETURN_NONE;
        }
        double d = PyFloat_AS_DOUBLE(item);
        uint64_t b;
        memcpy(&b, &d, 8);
        bits[i] = b;
        if (all_single) {
            uint32_t s;
            all_single = exact_single(d, &s);
        }
    }
    if (!all_single) {
        return result("float64", bits, n, 8);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        double d;
        float f;
        memcpy(&d, &bits[i], 8);
        f = (float)d;
        uint32_t s;
        memcpy(&s, &f, 4);
        bits[i] = s;
    }
    return result("float32", bits, n, 4);
}

static PyObject *
numbers(PyObject *module, PyObject *list)
{
    (void)module;
    if (!PyList_CheckExact(list)) {
        Py_RETURN_NONE;
    }
    Py_ssize_t n = PyList_GET_SIZE(list);
    if (n == 0) {
        return Py_BuildValue("(syO)", "int8", "", Py_False);
    }
    PyObject *first = PyList_GET_ITEM(list, 0);
    int is_int = PyLong_CheckExact(first);
    if (!is_int && !PyFloat_CheckExact(first)) {
        Py_RETURN_NONE;
    }
    uint64_t *bits = PyMem_Malloc((size_t)n * sizeof(uint64_t));
    if (bits == NULL) {
        return PyErr_NoMemory();
    }
    PyObject *out = is_int ? ints(list, n, bits) : floats(list, n, bits);
    PyMem_Free(bits);
    return out;
}

#if defined(CLOCK_MONOTONIC)
/* hand_over(budget_ns): let another thread of this process take the GIL, without a timed
 * sleep (docs/architecture/save-protocol.md, "Handing the GIL over").  The GIL is released,
 * then this thread yields its core (sched_yield: a thread woken for the GIL onto this core
 * runs at once) until another thread has taken the GIL or budget_ns have passed, and takes
 * it back (once that thread lets go of it).  time.sleep(0) napped for the kernel's timer
 * instead, ~90 us on this project's VM whatever the timer slack, wanted or not.  True when
 * another thread was seen taking the GIL.
 *
 * Up to 3.11 the runtime's current thread state is one process-wide pointer, set by the
 * thread that holds the GIL: seen non-NULL while this thread has let go, another thread took
 * it.  From 3.12 it is per thread: nothing is seen and the whole budget is yielded. */
static inline long long
monotonic_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static PyObject *
hand_over(PyObject *module, PyObject *arg)
{
    (void)module;
    long long budget = PyLong_AsLongLong(arg);
    if (budget == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (budget < 0 || budget > 1000000000LL) {
        PyErr_SetString(PyExc_ValueError, "hand_over: budget_ns must be within [0, 1e9]");
        return NULL;
    }
    int taken = 0;
    PyThreadState *self = PyEval_SaveThread();
    long long start = monotonic_ns();
    for (;;) {
#if PY_VERSION_HEX < 0x030C0000
        if (_PyThreadState_UncheckedGet() != NULL) {
            taken = 1;
            break;
        }
#endif
        if (monotonic_ns() - start >= budget) {
            break;
        }
        sched_yield();
    }
    PyEval_RestoreThread(self);
    return PyBool_FromLong(taken);
}
#endif

/* The bound accounting of a list or tuple of plain leaves, done as _Encoder._items would do it
 * (docs/architecture/samples-and-values.md, "Native list conversion"): encode() returns each such
 * leaf as it is, and _again() marks a str, float or int that the tree writes out at its first
 * appearance (leaves[id] = -1).  Only first appearances are taken here: a leaf met before (in
 * `leaves`, or twice in this list), a NaN, a long string, an int beyond int64 or any other value
 * returns False with `leaves` as it was, and the Python path does the whole list. */
enum { SKIP, MARK, OTHER };

static int
leaf_kind(PyObject *item)
{
    if (PyUnicode_CheckExact(item)) {
        Py_ssize_t n = PyUnicode_GetLength(item); /* len(): code points */
        if (n < 0) {
            PyErr_Clear();
            return OTHER;
        }
        return n >= 512 ? OTHER : (n > 1 ? MARK : SKIP); /* values._MIN_RAW_STR */
    }
    if (item == Py_None || PyBool_Check(item)) {
        return SKIP;
    }
    if (PyLong_CheckExact(item)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return OTHER;
        }
        /* values._SMALL_INT_LO < v < values._SMALL_INT_HI: not counted */
        return (-10000000LL < v && v < 100000000LL) ? SKIP : MARK;
    }
    if (PyFloat_CheckExact(item)) {
        return isnan(PyFloat_AS_DOUBLE(item)) ? OTHER : MARK;
    }
    return OTHER;
}

static PyObject *
first_leaves(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2 || !PyDict_CheckExact(args[1]) ||
        !(PyList_CheckExact(args[0]) || PyTuple_CheckExact(args[0]))) {
        PyErr_SetString(PyExc_TypeError, "first_leaves(list or tuple, dict)");
        return NULL;
    }
    PyObject *seq = args[0], *leaves = args[1];
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t marks = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int kind = leaf_kind(items[i]);
        if (kind == OTHER) {
            Py_RETURN_FALSE;
        }
        marks += kind == MARK;
    }
    if (marks == 0) {
        Py_RETURN_TRUE;
    }
    /* The keys this call added, to take back if a leaf turns out to be known. */
    PyObject **added = PyMem_Malloc((size_t)marks * sizeof(PyObject *));
    if (added == NULL) {
        return PyErr_NoMemory();
    }
    Py_ssize_t n_added = 0;
    PyObject *minus_one = PyLong_FromLong(-1);
    PyObject *out = Py_True;
    if (minus_one == NULL) {
        out = NULL;
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (leaf_kind(items[i]) != MARK) {
            continue;
        }
        PyObject *key = PyLong_FromVoidPtr(items[i]); /* what id() returns */
        if (key == NULL) {
            out = NULL;
            goto undo;
        }
        PyObject *had = PyDict_GetItemWithError(leaves, key);
        if (had != NULL || PyErr_Occurred()) {
            /* met before (or twice here): the Python path counts it, and may refuse */
            Py_DECREF(key);
            out = had != NULL ? Py_False : NULL;
            goto undo;
        }
        if (PyDict_SetItem(leaves, key, minus_one) < 0) {
            Py_DECREF(key);
            out = NULL;
            goto undo;
        }
        added[n_added++] = key;
    }
    goto done;
undo:
    for (Py_ssize_t k = 0; k < n_added; k++) {
        if (PyDict_DelItem(leaves, added[k]) < 0) {
            out = NULL;
        }
    }
done:
    for (Py_ssize_t k = 0; k < n_added; k++) {
        Py_DECREF(added[k]);
    }
    PyMem_Free(added);
    Py_XDECREF(minus_one);
    if (out == NULL) {
        return NULL;
    }
    return Py_NewRef(out);
}

/* One step of dict_items: mark `leaf` as _again() marks a first appearance (leaves[id] = -1);
 * 1 if it was marked, 0 if it was met before (the caller's Python callback counts it), -1 on
 * error. */
static int
mark_first(PyObject *leaves, PyObject *leaf, PyObject *minus_one)
{
    PyObject *key = PyLong_FromVoidPtr(leaf); /* what id() returns */
    if (key == NULL) {
        return -1;
    }
    PyObject *had = PyDict_GetItemWithError(leaves, key);
    int out;
    if (had != NULL) {
        out = 0;
    }
    else if (PyErr_Occurred()) {
        out = -1;
    }
    else {
        out = PyDict_SetItem(leaves, key, minus_one) < 0 ? -1 : 1;
    }
    Py_DECREF(key);
    return out;
}

/* Call fn(arg) with `where[0] = name` first (the caller's error message names it); the
 * result, or NULL.  A dict that changed size under the call fails as a dict comprehension
 * over it would. */
static PyObject *
call_at(PyObject *fn, PyObject *arg, PyObject *where, PyObject *name, PyObject *dict,
        Py_ssize_t size)
{
    Py_INCREF(name);
    if (PyList_SetItem(where, 0, name) < 0) {
        return NULL;
    }
    PyObject *out = PyObject_CallOneArg(fn, arg);
    if (out != NULL && PyDict_GET_SIZE(dict) != size) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_RuntimeError, "dictionary changed size during iteration");
        return NULL;
    }
    return out;
}

/* dict_items calls back into Python (encode -> _dict -> dict_items) once per level of dicts:
 * each level holds C stack (this frame and the interpreter's), which the recursion limit does
 * not bound (3.11 counts Python frames; its Python-to-Python calls take no C stack).  Under
 * sys.setrecursionlimit(100_000), 12,000 nested dicts overflowed the 8 MiB stack (a
 * segfault), and 400 under the default limit a thread's 256 KiB, where the Python loop
 * stores them or refuses them cleanly (tests/codec/test_codec_fast.py).  Past
 * this many dict_items frames in progress, a dict is left to the Python loop: the same bytes,
 * no more C stack.  One count for all threads (it only changes under the GIL): threads
 * encoding at once reach the Python loop sooner, never a different result. */
#define MAX_DICT_DEPTH 100
static int dict_depth = 0;

static PyObject *dict_items_at(PyObject *const *args);

/* A key the loop meets that the first pass did not vet (the dict changed under a callback:
 * another thread, a tensor ref's loader): as the Python loop's iterator, a key beyond the
 * dict's size fails; a key that is not an exact str or is the tag "$t" fails too, as it
 * would be written into the tree as something else (an int key as a string, "$t" as a tag
 * that makes the record unreadable). */
static int
key_changed(PyObject *k, Py_ssize_t *visited, Py_ssize_t size)
{
    if (++*visited > size || !PyUnicode_CheckExact(k) ||
        (PyUnicode_GET_LENGTH(k) == 2 && PyUnicode_CompareWithASCIIString(k, "$t") == 0)) {
        PyErr_SetString(PyExc_RuntimeError, "dictionary keys changed during iteration");
        return 1;
    }
    return 0;
}

/* _Encoder._dict's loop over a dict of str keys, done as the Python path does it
 * (docs/architecture/samples-and-values.md, "Native list conversion"):
 *   dict_items(value, leaves, encode, again, where) -> dict | None
 * None, with `leaves` as it was, when a key is not an exact str or the dict holds the tag
 * "$t" (the Python path writes a map).  Otherwise first the keys, when `again` is not None (a
 * dict below the top): each longer than one code point is counted as _again(key) counts it
 * (marked at its first appearance, again(key) otherwise); then the values, in order: a plain
 * leaf met for the first time is marked and kept as it is (what encode() would return), any
 * other value is encode(value).  where[0] holds the key being counted or encoded, for the
 * caller's error message. */
static PyObject *
dict_items(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 5 || !PyDict_CheckExact(args[0]) || !PyDict_CheckExact(args[1]) ||
        !PyList_CheckExact(args[4]) || PyList_GET_SIZE(args[4]) != 1) {
        PyErr_SetString(PyExc_TypeError,
                        "dict_items(dict, leaves dict, encode, again or None, [where])");
        return NULL;
    }
    if (dict_depth >= MAX_DICT_DEPTH) {
        Py_RETURN_NONE; /* the Python loop, with `leaves` untouched */
    }
    /* One level of the recursion limit for the Python loop's comprehension frame: the two
     * loops then refuse a dict nested too deeply at the same depth. */
    if (Py_EnterRecursiveCall(" while encoding a dict")) {
        return NULL;
    }
    dict_depth++;
    PyObject *out = dict_items_at(args);
    dict_depth--;
    Py_LeaveRecursiveCall();
    return out;
}

static PyObject *
dict_items_at(PyObject *const *args)
{
    PyObject *value = args[0], *leaves = args[1], *encode = args[2], *again = args[3];
    PyObject *where = args[4];
    Py_ssize_t size = PyDict_GET_SIZE(value);
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(value, &pos, &k, &v)) {
        if (!PyUnicode_CheckExact(k)) {
            Py_RETURN_NONE;
        }
        if (PyUnicode_GET_LENGTH(k) == 2 && PyUnicode_CompareWithASCIIString(k, "$t") == 0) {
            Py_RETURN_NONE;
        }
    }
    PyObject *minus_one = PyLong_FromLong(-1);
    if (minus_one == NULL) {
        return NULL;
    }
    PyObject *out = NULL;
    Py_ssize_t visited = 0;
    if (again != Py_None) {
        pos = 0;
        while (PyDict_Next(value, &pos, &k, &v)) {
            if (key_changed(k, &visited, size)) {
                goto fail;
            }
            if (PyUnicode_GET_LENGTH(k) <= 1) {
                continue;
            }
            int marked = mark_first(leaves, k, minus_one);
            if (marked < 0) {
                goto fail;
            }
            if (marked == 0) {
                Py_INCREF(k);
                PyObject *r = call_at(again, k, where, k, value, size);
                Py_DECREF(k);
                if (r == NULL) {
                    goto fail;
                }
                Py_DECREF(r);
            }
        }
    }
    out = PyDict_New();
    if (out == NULL) {
        goto fail;
    }
    pos = 0;
    visited = 0;
    while (PyDict_Next(value, &pos, &k, &v)) {
        if (key_changed(k, &visited, size)) {
            goto fail;
        }
        Py_INCREF(k);
        Py_INCREF(v);
        PyObject *item = NULL;
        int kind = leaf_kind(v);
        int marked = kind == MARK ? mark_first(leaves, v, minus_one) : 0;
        if (marked < 0) {
            /* error: item stays NULL */
        }
        else if (kind == SKIP || marked == 1) {
            item = Py_NewRef(v);
        }
        else {
            item = call_at(encode, v, where, k, value, size);
        }
        int failed = item == NULL || PyDict_SetItem(out, k, item) < 0;
        Py_XDECREF(item);
        Py_DECREF(v);
        Py_DECREF(k);
        if (failed) {
            goto fail;
        }
    }
    Py_DECREF(minus_one);
    return out;
fail:
    Py_XDECREF(out);
    Py_DECREF(minus_one);
    return NULL;
}

/* The search's prefilter (docs/architecture/search.md, "Search"): which of a chunk's inflated text
 * parts hold a needle's bytes, searched with the GIL released so that the other scan thread
 * inflates or reads meanwhile.  Exactly the rule of archive_manager.codec.chunk._holding_py:
 * a part is kept when it holds `needle` (compared after ASCII lower-casing of the part when
 * `folded`: bytes.lower() changes A-Z only) or any of `also` byte for byte. */
static unsigned char FOLD[256], SAME[256];

/* Boyer-Moore-Horspool over bytes mapped through `map` (the needle is already mapped). */
static int
holds(const unsigned char *hay, size_t n, const unsigned char *needle, size_t m,
      const unsigned char *map, const size_t *skip)
{
    if (m == 0) {
        return 1;
    }
    if (n < m) {
        return 0;
    }
    const unsigned char last = needle[m - 1];
    size_t i = 0;
    while (i <= n - m) {
        unsigned char c = map[hay[i + m - 1]];
        if (c == last) {
            size_t j = 0;
            while (j < m - 1 && map[hay[i + j]] == needle[j]) {
                j++;
            }
            if (j == m - 1) {
                return 1;
            }
        }
        i += skip[c];
    }
    return 0;
}

static void
skips(size_t *skip, const unsigned char *needle, size_t m)
{
    for (int c = 0; c < 256; c++) {
        skip[c] = m ? m : 1;
    }
    for (size_t j = 0; j + 1 < m; j++) {
        skip[needle[j]] = m - 1 - j;
    }
}

static int
holds_exact(const unsigned char *hay, size_t n, const unsigned char *needle, size_t m,
            const size_t *skip)
{
#ifdef __GLIBC__
    /* glibc's memmem is faster than the loop below on long haystacks */
    (void)skip;
    return m == 0 || (n >= m && memmem(hay, n, needle, m) != NULL);
#else
    return holds(hay, n, needle, m, SAME, skip);
#endif
}

static PyObject *
texts_holding(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4 || !PyBytes_CheckExact(args[1]) || !PyTuple_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "texts_holding(parts, needle: bytes, folded: bool, also: tuple)");
        return NULL;
    }
    int folded = PyObject_IsTrue(args[2]);
    if (folded < 0) {
        return NULL;
    }
    PyObject *parts = PySequence_Fast(args[0], "parts must be a sequence of buffers");
    if (parts == NULL) {
        return NULL;
    }
    PyObject *also = args[3];
    Py_ssize_t n = PySequence_Fast_GET_SIZE(parts), n_also = PyTuple_GET_SIZE(also);
    for (Py_ssize_t k = 0; k < n_also; k++) {
        if (!PyBytes_CheckExact(PyTuple_GET_ITEM(also, k))) {
            Py_DECREF(parts);
            PyErr_SetString(PyExc_TypeError, "also must be a tuple of bytes");
            return NULL;
        }
    }
    Py_buffer *views = PyMem_Calloc((size_t)n + 1, sizeof(Py_buffer));
    char *hit = PyMem_Calloc((size_t)n + 1, 1);
    size_t *skip = PyMem_Malloc(256 * sizeof(size_t) * (size_t)(1 + n_also));
    PyObject *out = NULL;
    Py_ssize_t got = 0;
    if (views == NULL || hit == NULL || skip == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    PyObject **items = PySequence_Fast_ITEMS(parts);
    for (; got < n; got++) {
        if (PyObject_GetBuffer(items[got], &views[got], PyBUF_SIMPLE) < 0) {
            goto done;
        }
    }
    /* bytes are immutable and every part's buffer is held: nothing changes under the loop */
    const unsigned char *needle = (const unsigned char *)PyBytes_AS_STRING(args[1]);
    const size_t m = (size_t)PyBytes_GET_SIZE(args[1]);
    const unsigned char **extra = (const unsigned char **)PyMem_Malloc(
        sizeof(unsigned char *) * (size_t)(n_also + 1));
    size_t *extra_len = PyMem_Malloc(sizeof(size_t) * (size_t)(n_also + 1));
    if (extra == NULL || extra_len == NULL) {
        PyMem_Free(extra);
        PyMem_Free(extra_len);
        PyErr_NoMemory();
        goto done;
    }
    skips(skip, needle, m);
    for (Py_ssize_t k = 0; k < n_also; k++) {
        PyObject *b = PyTuple_GET_ITEM(also, k);
        extra[k] = (const unsigned char *)PyBytes_AS_STRING(b);
        extra_len[k] = (size_t)PyBytes_GET_SIZE(b);
        skips(skip + 256 * (k + 1), extra[k], extra_len[k]);
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        const unsigned char *hay = views[i].buf;
        size_t len = (size_t)views[i].len;
        int found = folded ? holds(hay, len, needle, m, FOLD, skip)
                           : holds_exact(hay, len, needle, m, skip);
        for (Py_ssize_t k = 0; !found && k < n_also; k++) {
            found = holds_exact(hay, len, extra[k], extra_len[k], skip + 256 * (k + 1));
        }
        hit[i] = (char)found;
    }
    Py_END_ALLOW_THREADS
    PyMem_Free(extra);
    PyMem_Free(extra_len);
    out = PyList_New(0);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        if (!hit[i]) {
            continue;
        }
        PyObject *index = PyLong_FromSsize_t(i);
        if (index == NULL || PyList_Append(out, index) < 0) {
            Py_XDECREF(index);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(index);
    }
done:
    for (Py_ssize_t k = 0; k < got; k++) {
        PyBuffer_Release(&views[k]);
    }
    PyMem_Free(views);
    PyMem_Free(hit);
    PyMem_Free(skip);
    Py_DECREF(parts);
    return out;
}

/* The list a stored numeric array decodes to: values._unshuffle(...).tolist(), without the
 * array.  The stored dtypes it takes, by name; any other is the Python path's. */
static const struct {
    const char *name;
    char kind; /* 'i' signed, 'u' unsigned, 'f' float */
    int width;
} STORED[] = {
    {"int8", 'i', 1},  {"uint8", 'u', 1},  {"int16", 'i', 2},   {"uint16", 'u', 2},
    {"int32", 'i', 4}, {"uint32", 'u', 4}, {"int64", 'i', 8},   {"uint64", 'u', 8},
    {"float32", 'f', 4}, {"float64", 'f', 8},
};
#define N_STORED (sizeof(STORED) / sizeof(STORED[0]))

#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

/* Item i, little-endian, from byte planes (plane j holds byte j of every item) or from
 * consecutive items; width is a constant at every call, so each loop is specialised. */
static ALWAYS_INLINE uint64_t
stored_bits(const unsigned char *b, Py_ssize_t i, Py_ssize_t n, int width, int shuffled)
{
    uint64_t v = 0;
    for (int j = 0; j < width; j++) {
        v |= (uint64_t)b[shuffled ? (Py_ssize_t)j * n + i : i * width + j] << (8 * j);
    }
    return v;
}

/* One item as a Python number, as numpy's tolist makes it. */
static ALWAYS_INLINE PyObject *
stored_item(uint64_t v, char kind, int width)
{
    if (kind == 'f') {
        if (width == 4) {
            float f;
            uint32_t u = (uint32_t)v;
            memcpy(&f, &u, 4);
            return PyFloat_FromDouble((double)f);
        }
        double d;
        memcpy(&d, &v, 8);
        return PyFloat_FromDouble(d);
    }
    if (kind == 'u') {
        return PyLong_FromUnsignedLongLong(v);
    }
    /* sign-extend the item's width */
    const int shift = 64 - 8 * width;
    return PyLong_FromLongLong((long long)((int64_t)(v << shift) >> shift));
}

static ALWAYS_INLINE int
fill_stored(PyObject *out, const unsigned char *b, Py_ssize_t n, char kind, int width,
            int shuffled)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = stored_item(stored_bits(b, i, n, width, shuffled), kind, width);
        if (item == NULL) {
            return -1;
        }
        PyList_SET_ITEM(out, i, item);
    }
    return 0;
}

static PyObject *
stored_list(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3 || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "stored_list(data, dtype: str, shuffled)");
        return NULL;
    }
    const char *name = PyUnicode_AsUTF8(args[1]);
    if (name == NULL) {
        return NULL;
    }
    int shuffled = PyObject_IsTrue(args[2]);
    if (shuffled < 0) {
        return NULL;
    }
    size_t k = 0;
    while (k < N_STORED && strcmp(STORED[k].name, name) != 0) {
        k++;
    }
    if (k == N_STORED) {
        Py_RETURN_NONE;
    }
    const char kind = STORED[k].kind;
    const int width = STORED[k].width;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (view.len % width) {
        /* the Python path raises the damaged record's error */
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    const Py_ssize_t n = view.len / width;
    const unsigned char *b = view.buf;
    /* one item or one-byte items lay out the same either way */
    shuffled = shuffled && width > 1;
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    int failed;
    /* No Python code runs in the loops: nothing changes the buffer or the list under them. */
    if (kind == 'f') {
        failed = width == 4 ? (shuffled ? fill_stored(out, b, n, 'f', 4, 1)
                                        : fill_stored(out, b, n, 'f', 4, 0))
                            : (shuffled ? fill_stored(out, b, n, 'f', 8, 1)
                                        : fill_stored(out, b, n, 'f', 8, 0));
    }
    else {
        switch (width * 2 + shuffled) {
        case 2:
            failed = fill_stored(out, b, n, kind, 1, 0);
            break;
        case 4:
            failed = fill_stored(out, b, n, kind, 2, 0);
            break;
        case 5:
            failed = fill_stored(out, b, n, kind, 2, 1);
            break;
        case 8:
            failed = fill_stored(out, b, n, kind, 4, 0);
            break;
        case 9:
            failed = fill_stored(out, b, n, kind, 4, 1);
            break;
        case 16:
            failed = fill_stored(out, b, n, kind, 8, 0);
            break;
        default:
            failed = fill_stored(out, b, n, kind, 8, 1);
            break;
        }
    }
    PyBuffer_Release(&view);
    if (failed) {
        /* the items not set yet are NULL, which a list's deallocation skips */
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* ---- Arenas made ready for a load (docs/architecture/reading.md, "Arenas made ahead") ----
 *
 * arenas_ahead(on) -> bool
 *   on: while a load builds its samples, pymalloc's arenas (the memory of every int, float
 *   and small object; 1 MiB each on 64 bits) come from a thread that maps them and writes
 *   their pages ahead, so the kernel's first touch of each page (zeroing and charging it:
 *   ~0.06 s for the 176 MB of numbers of the 1024-sample benchmark) runs on another core,
 *   not on the decoding thread.  The allocator is installed at the first of nested or
 *   concurrent loads (a count, under the GIL) and put back at the last; the thread starts
 *   only once a load has taken AHEAD_START arenas, so a small load costs two calls.  Each
 *   arena is a mapping of its own, as pymalloc's default allocator makes it, which that
 *   allocator unmaps when pymalloc frees it, during the load or after it.  So it is used
 *   only where the allocator found at import is CPython's own (a tool's, installed before,
 *   would be handed mappings its free() does not know: glibc aborts), and only while it is
 *   still the one installed: a tool's installed over it during a load is left in place at
 *   the end.  Only requests of pymalloc's arena size are served or counted (the hook also
 *   allocates the interpreter's frame stacks, of other sizes).
 *   Returns whether the allocator is now installed (on) or pymalloc's was put back (off).
 *   Linux only (mmap, MADV_POPULATE_WRITE or a write per page); elsewhere a no-op. */

#if defined(__linux__)
#include <dlfcn.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>

#define AHEAD_RING 4 /* arenas kept ready: at most 4 MiB mapped for nothing at a load's end */
#define AHEAD_START 4 /* arenas a load takes before the thread starts */
/* pymalloc's arena (obmalloc.c's ARENA_SIZE: 1 MiB on 64 bits since 3.10, 256 KiB before).
 * The same hook allocates the interpreter's frame stacks (16 KiB chunks, or larger for a
 * frame of many locals, 3.11+): only requests of this size are served or counted. */
#if SIZEOF_VOID_P > 4 && PY_VERSION_HEX >= 0x030A0000
#define AHEAD_SIZE ((size_t)1 << 20)
#else
#define AHEAD_SIZE ((size_t)1 << 18)
#endif

static struct {
    PyObjectArenaAllocator base; /* pymalloc's, at import */
    PyObjectArenaAllocator mine;
    int usable; /* base is CPython's own mmap allocator (`ahead_init`) */
    /* under the GIL of the interpreter that imported this module: */
    int loads; /* loads running */
    int installed;
    /* under `lock`: with isolated subinterpreters (3.12+) arenas are asked for under other
     * GILs too, and a pop must never race the end's unmapping of the ring */
    pthread_mutex_t lock;
    int taken;   /* arenas taken since installed, until the thread starts */
    int started;
    pthread_t thread;
    /* between the thread and the pops: */
    sem_t room;               /* free slots of the ring: the thread waits on it */
    atomic_size_t head, tail; /* ring[tail..head) ready; the thread moves head, pops tail */
    atomic_int stop;
    void *ring[AHEAD_RING];
} ahead = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void *
ahead_map(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        return NULL;
    }
#ifdef MADV_POPULATE_WRITE
    if (madvise(p, size, MADV_POPULATE_WRITE) == 0) {
        return p;
    }
#endif
    /* a kernel before 5.14: a write per page (4 KiB steps reach every page of any size) */
    for (size_t off = 0; off < size; off += 4096) {
        ((volatile char *)p)[off] = 0;
    }
    return p;
}

static void *
ahead_main(void *arg)
{
    (void)arg;
    for (;;) {
        while (sem_wait(&ahead.room) != 0) {
        }
        if (atomic_load(&ahead.stop)) {
            return NULL;
        }
        void *p = ahead_map(AHEAD_SIZE);
        if (p == NULL) {
            return NULL; /* out of memory: the loads map their own arenas, as without it */
        }
        size_t h = atomic_load_explicit(&ahead.head, memory_order_relaxed);
        ahead.ring[h % AHEAD_RING] = p;
        atomic_store_explicit(&ahead.head, h + 1, memory_order_release);
    }
}

/* With `lock` held. */
static void
ahead_start(void)
{
    if (sem_init(&ahead.room, 0, AHEAD_RING) != 0) {
        return;
    }
    atomic_store(&ahead.head, 0);
    atomic_store(&ahead.tail, 0);
    atomic_store(&ahead.stop, 0);
    /* no signal is delivered to the thread: Python's handlers run on its own threads */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    ahead.started = pthread_create(&ahead.thread, NULL, ahead_main, NULL) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!ahead.started) {
        sem_destroy(&ahead.room);
        return;
    }
#ifdef __GLIBC__
    pthread_setname_np(ahead.thread, "archive-arenas"); /* as ps and /proc show it */
#endif
}

/* pymalloc's arena allocator while installed (called with some interpreter's GIL held). */
static void *
ahead_alloc(void *ctx, size_t size)
{
    (void)ctx;
    void *p = NULL;
    /* Not installed: a tool that was installed over this allocator during a load put it
     * back after the load ended; it is pymalloc's then. */
    if (size == AHEAD_SIZE && ahead.installed) {
        pthread_mutex_lock(&ahead.lock);
        if (ahead.started) {
            size_t t = atomic_load_explicit(&ahead.tail, memory_order_relaxed);
            if (t != atomic_load_explicit(&ahead.head, memory_order_acquire)) {
                p = ahead.ring[t % AHEAD_RING];
                atomic_store_explicit(&ahead.tail, t + 1, memory_order_relaxed);
                sem_post(&ahead.room);
            }
        }
        else if (++ahead.taken == AHEAD_START) {
            ahead_start();
        }
        pthread_mutex_unlock(&ahead.lock);
    }
    /* none ready (the thread is behind, or not started): mapped here, as without it */
    return p != NULL ? p : ahead.base.alloc(ahead.base.ctx, size);
}

static void
ahead_free(void *ctx, void *ptr, size_t size)
{
    (void)ctx;
    ahead.base.free(ahead.base.ctx, ptr, size);
}

/* Unmap the arenas the thread made that nothing took (the thread stopped or, in a forked
 * child, absent). */
static void
ahead_unmap_ring(void)
{
    size_t h = atomic_load(&ahead.head);
    for (size_t t = atomic_load(&ahead.tail); t != h; t++) {
        munmap(ahead.ring[t % AHEAD_RING], AHEAD_SIZE);
    }
}

/* Stop the thread and unmap the arenas it made that nothing took. */
static void
ahead_stop(void)
{
    pthread_mutex_lock(&ahead.lock);
    if (ahead.started) {
        atomic_store(&ahead.stop, 1);
        sem_post(&ahead.room);
        pthread_join(ahead.thread, NULL); /* at most one arena's mapping away */
        ahead_unmap_ring();
        sem_destroy(&ahead.room);
        ahead.started = 0;
    }
    pthread_mutex_unlock(&ahead.lock);
}

static int
same_allocator(const PyObjectArenaAllocator *a, const PyObjectArenaAllocator *b)
{
    return a->ctx == b->ctx && a->alloc == b->alloc && a->free == b->free;
}

static PyObject *
arenas_ahead(PyObject *module, PyObject *on)
{
    (void)module;
    int want = PyObject_IsTrue(on);
    if (want < 0) {
        return NULL;
    }
    if (want) {
        if (ahead.loads++ == 0 && ahead.usable) {
            PyObjectArenaAllocator now;
            PyObject_GetArenaAllocator(&now);
            /* pymalloc's, or this one (put back by a tool it was under) */
            if (same_allocator(&now, &ahead.base) || same_allocator(&now, &ahead.mine)) {
                pthread_mutex_lock(&ahead.lock);
                ahead.taken = 0;
                pthread_mutex_unlock(&ahead.lock);
                PyObject_SetArenaAllocator(&ahead.mine);
                ahead.installed = 1;
            }
        }
        return PyBool_FromLong(ahead.installed);
    }
    if (ahead.loads > 0 && --ahead.loads == 0 && ahead.installed) {
        PyObjectArenaAllocator now;
        PyObject_GetArenaAllocator(&now);
        /* A tool's installed over this one during the load stays (it may hand its own memory
         * out and take it back); pymalloc's comes back only in place of this one. */
        int back = same_allocator(&now, &ahead.mine);
        if (back) {
            PyObject_SetArenaAllocator(&ahead.base);
        }
        ahead.installed = 0;
        ahead_stop();
        return PyBool_FromLong(back);
    }
    Py_RETURN_FALSE;
}

/* fork() while another thread pops must not leave the child a held lock. */
static void
ahead_before_fork(void)
{
    pthread_mutex_lock(&ahead.lock);
}

static void
ahead_after_fork_parent(void)
{
    pthread_mutex_unlock(&ahead.lock);
}

/* A child forked during a load has no thread and runs no load: pymalloc's allocator again,
 * the arenas made ahead that nothing took unmapped. */
static void
ahead_after_fork_child(void)
{
    if (ahead.installed) {
        PyObjectArenaAllocator now;
        PyObject_GetArenaAllocator(&now);
        if (same_allocator(&now, &ahead.mine)) {
            PyObject_SetArenaAllocator(&ahead.base);
        }
        ahead.installed = 0;
    }
    ahead.loads = 0;
    if (ahead.started) {
        ahead_unmap_ring();
        ahead.started = 0;
    }
    pthread_mutex_init(&ahead.lock, NULL);
}

static void
ahead_init(void)
{
    PyObject_GetArenaAllocator(&ahead.base);
    /* CPython's own arena allocator (mmap and munmap, no context) is defined in the same
     * object as PyObject_Malloc (libpython, or the interpreter linked statically); one a
     * tool installed before this import is not, and must never free a mapping of ours. */
    Dl_info theirs, cpython;
    ahead.usable = ahead.base.ctx == NULL && ahead.base.alloc != NULL &&
                   dladdr((void *)ahead.base.alloc, &theirs) != 0 &&
                   dladdr((void *)PyObject_Malloc, &cpython) != 0 &&
                   theirs.dli_fbase == cpython.dli_fbase;
    ahead.mine.ctx = NULL;
    ahead.mine.alloc = ahead_alloc;
    ahead.mine.free = ahead_free;
    pthread_atfork(ahead_before_fork, ahead_after_fork_parent, ahead_after_fork_child);
}
#else
static PyObject *
arenas_ahead(PyObject *module, PyObject *on)
{
    (void)module;
    if (PyObject_IsTrue(on) < 0) {
        return NULL;
    }
    Py_RETURN_FALSE;
}

static void
ahead_init(void)
{
}
#endif

/* ---- Snapshots for save_async (docs/architecture/save-protocol.md, "Saving in the
 * background"; codec/snapshot.py) ----
 *
 * take_dict(value, out, memo, taken_cls, take, pending, same, plain) -> nbytes | None
 *   _Taker._fill's loop, as the Python loop does it: the empty dict `out` gets the keys of
 *   `value` (exact str; for any other key None is returned, `out` still empty, and the Python
 *   loop does it), each with a plain leaf kept as it is (None, bool, int, float, str, bytes,
 *   a value whose exact type is in the set `same`), a list of at least
 *   values._MIN_ARRAY_LEN items whose first is an exact int or float (memo[id(list)], or a
 *   new taken_cls(len) put there and (list, taken) appended to pending), a dict of str keys
 *   or an object of a class `plain` maps to its declared field names (memo[id(value)], or a
 *   new copy put there and filled by this loop: _Taker._dict, _Taker._object), another list
 *   of plain leaves only (memo[id(list)], or a new list of its items put there:
 *   _Taker._list), or take(value) for anything else.  nbytes: 16 per entry plus the len of
 *   each str and bytes kept, and 8 per item of a list copied plus the len of its texts.
 *
 * take_object(value, memo, taken_cls, take, pending, same, plain) -> (copy, nbytes) | None
 *   The same loop's copy of an object of a class in `plain` (_Taker._object), or None when
 *   its class is not there or the Python path is to take it.
 *
 * fill_taken(pending, threads) -> list of indices
 *   Give each pending TakenList what numbers(list) gives its list (dtype, data, shuffled);
 *   the indices of the entries whose list numbers() does not take or that is empty.  The lists are read on
 *   `threads` threads (this one included) while this thread holds the GIL, so no Python code
 *   runs anywhere meanwhile: the lists and their items cannot change.  The other threads read
 *   exact ints held in one digit and exact floats only, through no Python API; any other list
 *   is left to this thread, which converts it with numbers(). */

#define MIN_ARRAY_LEN 8 /* values._MIN_ARRAY_LEN */
static PyObject *queue_prefix; /* samples.QUEUE_PREFIX, "_queue_" (made at import) */
#define MAX_TAKE_DEPTH 100
static int take_depth = 0; /* as dict_depth: bounds the C stack of nested take_dict calls */

static PyObject *attr_dtype, *attr_data, *attr_shuffled, *attr_length; /* interned at import */

typedef struct {
    PyObject *memo, *taken_cls, *take, *pending, *same, *plain;
    Py_ssize_t nbytes;
} take_ctx;

static PyObject *
taken_list(take_ctx *c, PyObject *list)
{
    PyObject *key = PyLong_FromVoidPtr(list); /* what id() returns */
    if (key == NULL) {
        return NULL;
    }
    PyObject *known = PyDict_GetItemWithError(c->memo, key);
    if (known != NULL || PyErr_Occurred()) {
        Py_DECREF(key);
        return Py_XNewRef(known);
    }
    PyObject *n = PyLong_FromSsize_t(PyList_GET_SIZE(list));
    PyObject *taken = n == NULL ? NULL : PyObject_CallNoArgs(c->taken_cls);
    if (taken != NULL && PyObject_SetAttr(taken, attr_length, n) < 0) {
        Py_CLEAR(taken);
    }
    Py_XDECREF(n);
    PyObject *entry = taken == NULL ? NULL : PyTuple_Pack(2, list, taken);
    int failed = entry == NULL || PyDict_SetItem(c->memo, key, taken) < 0 ||
                 PyList_Append(c->pending, entry) < 0;
    Py_DECREF(key);
    Py_XDECREF(entry);
    if (failed) {
        Py_XDECREF(taken);
        return NULL;
    }
    return taken;
}

static int take_into(take_ctx *c, PyObject *value, PyObject *out);

/* `value` looked up in the memo: 1 when the caller is to return *found (the copy made
 * before, a new reference; NULL without an error past MAX_TAKE_DEPTH, where the Python path
 * takes it; NULL with one on error), 0 when it is to make the copy, under *key (a new
 * reference to id(value)). */
static int
memo_find(take_ctx *c, PyObject *value, PyObject **key, PyObject **found)
{
    *found = NULL;
    *key = PyLong_FromVoidPtr(value);
    if (*key == NULL) {
        return 1;
    }
    PyObject *known = PyDict_GetItemWithError(c->memo, *key);
    if (known != NULL || PyErr_Occurred() || take_depth >= MAX_TAKE_DEPTH) {
        Py_CLEAR(*key);
        *found = Py_XNewRef(known);
        return 1;
    }
    return 0;
}

/* A dict met in the loop: its copy (memo[id(dict)], or a new one put there and filled by the
 * loop); NULL without an error when the Python path is to take it (a key not an exact str,
 * nesting past MAX_TAKE_DEPTH). */
static PyObject *
take_nested(take_ctx *c, PyObject *value)
{
    PyObject *key, *found;
    if (memo_find(c, value, &key, &found)) {
        return found;
    }
    PyObject *out = PyDict_New();
    int status = -1;
    if (out != NULL && PyDict_SetItem(c->memo, key, out) == 0) {
        if (Py_EnterRecursiveCall(" while taking a dict") == 0) {
            take_depth++;
            status = take_into(c, value, out);
            take_depth--;
            Py_LeaveRecursiveCall();
        }
        if (status == 1 && PyDict_DelItem(c->memo, key) < 0) {
            status = -1; /* the Python path must not find this copy in the memo */
        }
    }
    Py_DECREF(key);
    if (status != 0) {
        Py_XDECREF(out);
        return NULL;
    }
    return out;
}

/* A list that is no array to defer, of plain leaves only (None, bool, exact int, float, str,
 * bytes): its copy (memo[id(list)], or a new list of the same items put there), counted as
 * _Taker._list counts it; NULL without an error when the Python path is to take it (an item
 * of any other kind, nesting past MAX_TAKE_DEPTH).  One call back into Python fewer per
 * sample of a slime rollout (its weight_versions). */
static PyObject *
take_list(take_ctx *c, PyObject *value)
{
    PyObject *key, *found;
    if (memo_find(c, value, &key, &found)) {
        return found;
    }
    const Py_ssize_t n = PyList_GET_SIZE(value);
    Py_ssize_t text = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(value, i);
        if (v == Py_None || PyBool_Check(v) || PyLong_CheckExact(v) || PyFloat_CheckExact(v)) {
            continue;
        }
        if (PyUnicode_CheckExact(v)) {
            text += PyUnicode_GET_LENGTH(v);
        }
        else if (PyBytes_CheckExact(v)) {
            text += PyBytes_GET_SIZE(v);
        }
        else {
            Py_DECREF(key);
            return NULL; /* the Python path */
        }
    }
    /* no Python code ran since the size was read: the slice is the items counted */
    PyObject *copy = PyList_GetSlice(value, 0, n);
    if (copy != NULL && PyDict_SetItem(c->memo, key, copy) < 0) {
        Py_CLEAR(copy);
    }
    Py_DECREF(key);
    if (copy != NULL) {
        c->nbytes += 8 * n + text;
    }
    return copy;
}

/* Whether `key` names live queue state the class does not declare (samples.is_queue_key):
 * 1, 0, or -1 on error. */
static int
queue_key(PyObject *key, PyObject *declared)
{
    if (!PyUnicode_Check(key)) {
        return 0;
    }
    Py_ssize_t starts = PyUnicode_Tailmatch(key, queue_prefix, 0, PY_SSIZE_T_MAX, -1);
    if (starts != 1) {
        return (int)starts; /* 0, or -1 on error */
    }
    int known = PySet_Contains(declared, key);
    return known < 0 ? -1 : !known;
}

/* An object of a class in `plain` (a dataclass whose fields are plain attributes:
 * _Taker._object): its copy (memo[id(value)], or a new object of its class, made as
 * object.__new__ makes it, over a copy of its __dict__ without undeclared queue state); NULL
 * without an error when the Python path is to take it. */
static PyObject *
take_object(take_ctx *c, PyObject *value, PyObject *declared)
{
    PyObject *key, *found;
    if (memo_find(c, value, &key, &found)) {
        return found;
    }
    PyObject *state = PyObject_GenericGetDict(value, NULL);
    PyObject *copy = NULL, *fields = NULL, *source = NULL, *out = NULL;
    int status = -1;
    if (state == NULL) {
        goto done;
    }
    if (!PyDict_CheckExact(state) || !PyAnySet_Check(declared)) {
        status = 1; /* the Python path */
        goto done;
    }
    source = Py_NewRef(state);
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(state, &pos, &k, &v)) {
        int queue = queue_key(k, declared);
        if (queue < 0) {
            goto done;
        }
        if (queue) {
            /* left out, as sample_to_record leaves it out */
            Py_SETREF(source, PyDict_New());
            if (source == NULL) {
                goto done;
            }
            pos = 0;
            while (PyDict_Next(state, &pos, &k, &v)) {
                queue = queue_key(k, declared);
                if (queue < 0 || (!queue && PyDict_SetItem(source, k, v) < 0)) {
                    goto done;
                }
            }
            break;
        }
    }
    PyObject *no_args = PyTuple_New(0);
    copy = no_args == NULL ? NULL : PyBaseObject_Type.tp_new(Py_TYPE(value), no_args, NULL);
    Py_XDECREF(no_args);
    fields = copy == NULL ? NULL : PyDict_New();
    if (fields == NULL || PyDict_SetItem(c->memo, key, copy) < 0) {
        goto done;
    }
    if (Py_EnterRecursiveCall(" while taking an object") == 0) {
        take_depth++;
        status = take_into(c, source, fields);
        take_depth--;
        Py_LeaveRecursiveCall();
    }
    if (status == 1 && PyDict_DelItem(c->memo, key) < 0) {
        status = -1; /* the Python path must not find this copy in the memo */
    }
    if (status == 0 && PyObject_GenericSetDict(copy, fields, NULL) < 0) {
        status = -1;
    }
    if (status == 0) {
        out = Py_NewRef(copy);
    }
done:
    Py_DECREF(key);
    Py_XDECREF(state);
    Py_XDECREF(source);
    Py_XDECREF(copy);
    Py_XDECREF(fields);
    return out; /* NULL: an error, or (none set) the Python path's */
}

/* The loop over `value` into the empty dict `out`: 0, -1 on error, 1 when a key is not an
 * exact str (`out` untouched, nothing counted). */
static int
take_into(take_ctx *c, PyObject *value, PyObject *out)
{
    Py_ssize_t size = PyDict_GET_SIZE(value);
    Py_ssize_t pos = 0, visited = 0;
    PyObject *k, *v;
    while (PyDict_Next(value, &pos, &k, &v)) {
        if (!PyUnicode_CheckExact(k)) {
            return 1;
        }
    }
    c->nbytes += 16 * size;
    pos = 0;
    while (PyDict_Next(value, &pos, &k, &v)) {
        if (++visited > size || !PyUnicode_CheckExact(k)) {
            PyErr_SetString(PyExc_RuntimeError, "dictionary keys changed during iteration");
            return -1;
        }
        Py_INCREF(k);
        Py_INCREF(v);
        PyObject *item;
        if (v == Py_None || PyBool_Check(v) || PyLong_CheckExact(v) || PyFloat_CheckExact(v)) {
            item = Py_NewRef(v);
        }
        else if (PyUnicode_CheckExact(v)) {
            c->nbytes += PyUnicode_GET_LENGTH(v);
            item = Py_NewRef(v);
        }
        else if (PyBytes_CheckExact(v)) {
            c->nbytes += PyBytes_GET_SIZE(v);
            item = Py_NewRef(v);
        }
        else if (PyList_CheckExact(v) && PyList_GET_SIZE(v) >= MIN_ARRAY_LEN &&
                 (PyLong_CheckExact(PyList_GET_ITEM(v, 0)) ||
                  PyFloat_CheckExact(PyList_GET_ITEM(v, 0)))) {
            item = taken_list(c, v);
        }
        else {
            int kept = PySet_Contains(c->same, (PyObject *)Py_TYPE(v));
            PyObject *declared = kept == 0 ? PyDict_GetItemWithError(c->plain,
                                                                     (PyObject *)Py_TYPE(v))
                                           : NULL;
            if (kept == 1) {
                item = Py_NewRef(v);
            }
            else {
                item = kept == 0 && PyDict_CheckExact(v) ? take_nested(c, v)
                       : kept == 0 && PyList_CheckExact(v) ? take_list(c, v)
                       : declared != NULL                ? take_object(c, v, declared)
                                                         : NULL;
                if (item == NULL && !PyErr_Occurred()) {
                    item = PyObject_CallOneArg(c->take, v);
                }
                if (item != NULL && PyDict_GET_SIZE(value) != size) {
                    Py_CLEAR(item);
                    PyErr_SetString(PyExc_RuntimeError,
                                    "dictionary changed size during iteration");
                }
            }
        }
        int failed = item == NULL || PyDict_SetItem(out, k, item) < 0;
        Py_XDECREF(item);
        Py_DECREF(v);
        Py_DECREF(k);
        if (failed) {
            return -1;
        }
    }
    return 0;
}

static int
take_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t first, const char *usage)
{
    if (nargs != first + 6 || !PyDict_CheckExact(args[first]) ||
        !PyList_CheckExact(args[first + 3]) || !PyAnySet_CheckExact(args[first + 4]) ||
        !PyDict_CheckExact(args[first + 5])) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    return 0;
}

static PyObject *
take_object_entry(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (take_args(args, nargs, 1,
                  "take_object(value, memo dict, taken class, take, pending list, same set, "
                  "plain dict)") < 0) {
        return NULL;
    }
    PyObject *declared = PyDict_GetItemWithError(args[6], (PyObject *)Py_TYPE(args[0]));
    if (declared == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    take_ctx c = {args[1], args[2], args[3], args[4], args[5], args[6], 0};
    PyObject *copy = take_object(&c, args[0], declared);
    if (copy == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(Nn)", copy, c.nbytes);
}

static PyObject *
take_dict(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (take_args(args, nargs, 2,
                  "take_dict(dict, empty dict, memo dict, taken class, take, pending list, "
                  "same set, plain dict)") < 0) {
        return NULL;
    }
    if (!PyDict_CheckExact(args[0]) || !PyDict_CheckExact(args[1]) ||
        PyDict_GET_SIZE(args[1]) != 0) {
        PyErr_SetString(PyExc_TypeError, "take_dict takes a dict and an empty dict");
        return NULL;
    }
    if (take_depth >= MAX_TAKE_DEPTH) {
        Py_RETURN_NONE; /* the Python loop */
    }
    take_ctx c = {args[2], args[3], args[4], args[5], args[6], args[7], 0};
    if (Py_EnterRecursiveCall(" while taking a dict")) {
        return NULL;
    }
    take_depth++;
    int status = take_into(&c, args[0], args[1]);
    take_depth--;
    Py_LeaveRecursiveCall();
    if (status < 0) {
        return NULL;
    }
    if (status == 1) {
        Py_RETURN_NONE;
    }
    return PyLong_FromSsize_t(c.nbytes);
}

/* The memory fill_taken writes a batch's arrays into: one slab per call, its arrays handed
 * out as read-only memoryviews of it, and the slab kept for a later call once the last of
 * them is gone (up to SLAB_KEEP bytes, whose pages stay the process's).  A bytes object per
 * array (what numbers() returns) costs a page fault per 4 KiB written, on the caller's
 * thread, whenever malloc gave the memory back to the system since the last snapshot, which
 * it does after large frees: up to a fifth of the snapshot's CPU on the realistic rollout
 * (docs/performance.md, "Saving in the background").  MADV_FREE on a kept slab would let
 * the kernel take its pages back, but writing them again then costs a quarter of the faults
 * it saves (measured).  Made and freed only with the GIL held. */
#define SLAB_GRAIN ((size_t)1 << 20)
#define SLAB_KEEP ((size_t)64 << 20)
#define SLAB_SLOTS 32

typedef struct {
    PyObject_HEAD
    unsigned char *base;
    size_t size;
} slab_object;

static struct {
    unsigned char *base;
    size_t size;
} slab_kept[SLAB_SLOTS];
static int slab_kept_count = 0;
static size_t slab_kept_bytes = 0;

static unsigned char *
slab_map(size_t size)
{
#if defined(__linux__)
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
#else
    return PyMem_RawMalloc(size);
#endif
}

static void
slab_unmap(unsigned char *base, size_t size)
{
#if defined(__linux__)
    munmap(base, size);
#else
    (void)size;
    PyMem_RawFree(base);
#endif
}

/* Forget the kept slab at index i (the others keep their order: oldest first). */
static void
slab_forget(int i)
{
    slab_kept_bytes -= slab_kept[i].size;
    slab_kept_count--;
    memmove(&slab_kept[i], &slab_kept[i + 1],
            (size_t)(slab_kept_count - i) * sizeof(slab_kept[0]));
}

static void
slab_dealloc(PyObject *self)
{
    slab_object *s = (slab_object *)self;
    if (s->base != NULL) {
        if (s->size > SLAB_KEEP) {
            slab_unmap(s->base, s->size);
        }
        else {
            /* the newest is kept, the oldest given back to make room */
            while (slab_kept_count == SLAB_SLOTS || slab_kept_bytes + s->size > SLAB_KEEP) {
                slab_unmap(slab_kept[0].base, slab_kept[0].size);
                slab_forget(0);
            }
            slab_kept[slab_kept_count].base = s->base;
            slab_kept[slab_kept_count].size = s->size;
            slab_kept_count++;
            slab_kept_bytes += s->size;
        }
    }
    Py_TYPE(self)->tp_free(self);
}

static int
slab_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    slab_object *s = (slab_object *)self;
    return PyBuffer_FillInfo(view, self, s->base, (Py_ssize_t)s->size, 1, flags);
}

static PyBufferProcs slab_as_buffer = {slab_getbuffer, NULL};

static PyTypeObject slab_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "archive_manager.codec._native.Slab",
    .tp_basicsize = sizeof(slab_object),
    .tp_dealloc = slab_dealloc,
    .tp_as_buffer = &slab_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Memory a snapshot's arrays are read from (fill_taken).",
};

/* A slab of at least `need` bytes: a kept one that fits (the smallest, and not more than
 * twice what is needed plus a grain; of those, the one kept last), or a new one. */
static PyObject *
slab_new(size_t need)
{
    size_t size = (need + SLAB_GRAIN - 1) / SLAB_GRAIN * SLAB_GRAIN;
    int best = -1;
    for (int i = 0; i < slab_kept_count; i++) {
        size_t have = slab_kept[i].size;
        if (have >= size && have <= 2 * size + SLAB_GRAIN &&
            (best < 0 || have <= slab_kept[best].size)) {
            best = i;
        }
    }
    slab_object *s = PyObject_New(slab_object, &slab_type);
    if (s == NULL) {
        return NULL;
    }
    if (best >= 0) {
        s->base = slab_kept[best].base;
        s->size = slab_kept[best].size;
        slab_forget(best);
    }
    else {
        s->size = size;
        s->base = slab_map(size);
        if (s->base == NULL) {
            Py_DECREF(s);
            return PyErr_NoMemory();
        }
    }
    return (PyObject *)s;
}

enum { TAKE_PENDING, TAKE_DONE, TAKE_OTHER, TAKE_ON_MAIN };

typedef struct {
    PyObject **items; /* the list's items: no Python code runs while they are read */
    Py_ssize_t n;
    size_t offset; /* where its array is in the slab (once converted) */
    int status;
    int width;
    const char *name;
} take_entry;

typedef struct {
    take_entry *entries;
    Py_ssize_t count;
    Py_ssize_t next; /* the next entry a thread takes (atomic) */
    Py_ssize_t max_n;
    unsigned char *slab; /* room for every entry at 4 bytes an item */
    size_t used;         /* the slab's bytes handed to entries so far (atomic) */
} take_batch;

typedef struct {
    take_batch *batch;
    PyThread_type_lock done; /* released when the thread has converted its last entry */
} take_helper;

#if defined(__GNUC__) || defined(__clang__)
#define TAKE_NEXT(batch) __atomic_fetch_add(&(batch)->next, 1, __ATOMIC_RELAXED)
#define TAKE_ROOM(batch, n) __atomic_fetch_add(&(batch)->used, (n), __ATOMIC_RELAXED)
#define TAKE_MAX_THREADS 16
#else
#define TAKE_NEXT(batch) ((batch)->next++)
#define TAKE_ROOM(batch, n) (((batch)->used += (n)) - (n))
#define TAKE_MAX_THREADS 1 /* no atomics known here: this thread alone */
#endif

static void
convert_entry(take_batch *batch, take_entry *e, uint64_t *bits, uint32_t *singles)
{
    PyObject **items = e->items;
    const Py_ssize_t n = e->n;
    if (n == 0) {
        e->status = TAKE_OTHER; /* emptied since it was collected: no array */
        return;
    }
    const int is_float = !Py_IS_TYPE(items[0], &PyLong_Type);
    if (!is_float) {
        long long first;
        if (!compact_value(items[0], &first)) {
            e->status = TAKE_ON_MAIN; /* numbers() reads it through the API */
            return;
        }
        int64_t lo = first, hi = first;
        /* the item before, read: a mask's runs are one object (a small int) over and over */
        PyObject *before = items[0];
        long long v = first;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = items[i];
            if (item != before) {
                if (!Py_IS_TYPE(item, &PyLong_Type)) {
                    e->status = TAKE_OTHER;
                    return;
                }
                if (!compact_value(item, &v)) {
                    e->status = TAKE_ON_MAIN; /* numbers() reads it through the API */
                    return;
                }
                lo = v < lo ? v : lo;
                hi = v > hi ? v : hi;
                before = item;
            }
            bits[i] = (uint64_t)v;
        }
        for (size_t k = 0; k < N_NARROWING; k++) {
            if (NARROWING[k].lo <= lo && hi <= NARROWING[k].hi) {
                e->name = NARROWING[k].name;
                e->width = NARROWING[k].width;
                break;
            }
        }
        if (e->width > 4) {
            e->status = TAKE_ON_MAIN; /* no room: the slab holds 4 bytes an item */
            return;
        }
    }
    else {
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = items[i];
            if (!Py_IS_TYPE(item, &PyFloat_Type)) {
                e->status = TAKE_OTHER;
                return;
            }
            if (!exact_single(PyFloat_AS_DOUBLE(item), &singles[i])) {
                /* float64 (or no array, if a later item is no float): numbers() decides,
                 * as the slab has no room for 8 bytes an item */
                e->status = TAKE_ON_MAIN;
                return;
            }
        }
        e->name = "float32";
        e->width = 4;
    }
    /* packed as they come (8-byte aligned): the slab's pages past the last are not touched */
    e->offset = TAKE_ROOM(batch, ((size_t)n * (size_t)e->width + 7) & ~(size_t)7);
    if (is_float) {
        planes32(batch->slab + e->offset, singles, n);
    }
    else {
        planes(batch->slab + e->offset, bits, n, e->width);
    }
    e->status = TAKE_DONE;
}

static void
run_entries(take_batch *batch, uint64_t *bits, uint32_t *singles)
{
    for (;;) {
        Py_ssize_t i = TAKE_NEXT(batch);
        if (i >= batch->count) {
            return;
        }
        convert_entry(batch, &batch->entries[i], bits, singles);
    }
}

/* A helper thread: no Python thread state, no Python API; plain malloc. */
static void
take_helper_main(void *arg)
{
    take_helper *h = arg;
    uint64_t *bits = malloc((size_t)h->batch->max_n * sizeof(uint64_t));
    uint32_t *singles = malloc((size_t)h->batch->max_n * sizeof(uint32_t));
    if (bits != NULL && singles != NULL) {
        run_entries(h->batch, bits, singles); /* else it takes none: the others do them */
    }
    free(bits);
    free(singles);
    PyThread_release_lock(h->done);
}


static int
set_taken(PyObject *taken, PyObject *name, PyObject *data, PyObject *shuffled)
{
    if (PyObject_SetAttr(taken, attr_dtype, name) < 0 ||
        PyObject_SetAttr(taken, attr_data, data) < 0 ||
        PyObject_SetAttr(taken, attr_shuffled, shuffled) < 0) {
        return -1;
    }
    return 0;
}

static PyObject *
fill_taken(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "fill_taken(pending list, threads)");
        return NULL;
    }
    PyObject *pending = args[0];
    long threads = PyLong_AsLong(args[1]);
    if (threads == -1 && PyErr_Occurred()) {
        return NULL;
    }
    const Py_ssize_t count = PyList_GET_SIZE(pending);
    /* the pending list and the lists in it are this call's while it runs (held below) */
    PyObject *held = PyList_GetSlice(pending, 0, count);
    take_entry *entries = PyMem_Calloc((size_t)count + 1, sizeof(take_entry));
    PyObject *bad = NULL, *slab = NULL, *whole = NULL;
    uint64_t *bits = NULL;
    uint32_t *singles = NULL;
    if (held == NULL || entries == NULL) {
        if (held != NULL) {
            PyErr_NoMemory();
        }
        goto done;
    }
    take_batch batch = {entries, count, 0, 1, NULL, 0};
    size_t room = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *entry = PyList_GET_ITEM(held, i);
        /* NOTE: a list may be empty: Python code ran between its collection and this call
         * (another thread, a class's own __dict__), and it is no array then */
        if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 2 ||
            !PyList_CheckExact(PyTuple_GET_ITEM(entry, 0))) {
            PyErr_SetString(PyExc_TypeError, "pending entries are (list, taken)");
            goto done;
        }
        PyObject *list = PyTuple_GET_ITEM(entry, 0);
        Py_ssize_t n = PyList_GET_SIZE(list);
        /* room for the items at 4 bytes (token ids, masks, float32 log-probs: at most that);
         * a list of wider items is converted by numbers() below */
        room += ((size_t)n * 4 + 7) & ~(size_t)7;
        entries[i].items = PySequence_Fast_ITEMS(list);
        entries[i].n = n;
        batch.max_n = n > batch.max_n ? n : batch.max_n;
    }
    if (room > 0) { /* none when every list is empty */
        slab = slab_new(room);
        whole = slab == NULL ? NULL : PyMemoryView_FromObject(slab);
        if (whole == NULL) {
            goto done;
        }
        batch.slab = ((slab_object *)slab)->base;
    }
    bits = PyMem_Malloc((size_t)batch.max_n * sizeof(uint64_t));
    singles = PyMem_Malloc((size_t)batch.max_n * sizeof(uint32_t));
    if (bits == NULL || singles == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    take_helper helpers[TAKE_MAX_THREADS];
    int started = 0;
    for (long t = 1; t < threads && t < TAKE_MAX_THREADS && t < count; t++) {
        helpers[started].batch = &batch;
        helpers[started].done = PyThread_allocate_lock();
        if (helpers[started].done == NULL) {
            break;
        }
        PyThread_acquire_lock(helpers[started].done, WAIT_LOCK);
        if (PyThread_start_new_thread(take_helper_main, &helpers[started]) ==
            PYTHREAD_INVALID_THREAD_ID) {
            PyThread_free_lock(helpers[started].done);
            break; /* fewer threads: this one converts what they do not */
        }
        started++;
    }
    run_entries(&batch, bits, singles);
    for (int t = 0; t < started; t++) {
        PyThread_acquire_lock(helpers[t].done, WAIT_LOCK);
        PyThread_release_lock(helpers[t].done);
        PyThread_free_lock(helpers[t].done);
    }
    bad = PyList_New(0);
    for (Py_ssize_t i = 0; bad != NULL && i < count; i++) {
        take_entry *e = &entries[i];
        PyObject *entry = PyList_GET_ITEM(held, i);
        PyObject *taken = PyTuple_GET_ITEM(entry, 1);
        int failed = 0;
        if (e->status == TAKE_DONE) {
            /* a read-only view of its part of the slab (which it keeps alive) */
            PyObject *data = PySequence_GetSlice(whole, (Py_ssize_t)e->offset,
                                                 (Py_ssize_t)e->offset + e->n * e->width);
            PyObject *name = data == NULL ? NULL : PyUnicode_InternFromString(e->name);
            PyObject *shuffled = (e->width > 1 && e->n > 1) ? Py_True : Py_False;
            failed = name == NULL || set_taken(taken, name, data, shuffled) < 0;
            Py_XDECREF(name);
            Py_XDECREF(data);
        }
        else {
            PyObject *got = e->status == TAKE_ON_MAIN
                                ? numbers(NULL, PyTuple_GET_ITEM(entry, 0))
                                : Py_NewRef(Py_None);
            if (got == NULL) {
                failed = 1;
            }
            else if (got == Py_None) {
                PyObject *index = PyLong_FromSsize_t(i);
                failed = index == NULL || PyList_Append(bad, index) < 0;
                Py_XDECREF(index);
            }
            else {
                failed = set_taken(taken, PyTuple_GET_ITEM(got, 0), PyTuple_GET_ITEM(got, 1),
                                   PyTuple_GET_ITEM(got, 2)) < 0;
            }
            Py_XDECREF(got);
        }
        if (failed) {
            Py_CLEAR(bad);
        }
    }
done:
    PyMem_Free(entries);
    PyMem_Free(bits);
    PyMem_Free(singles);
    Py_XDECREF(whole);
    Py_XDECREF(slab);
    Py_XDECREF(held);
    return bad;
}

static PyMethodDef methods[] = {
    {"dict_items", (PyCFunction)(void (*)(void))dict_items, METH_FASTCALL,
     "dict_items(value, leaves, encode, again, where) -> dict | None\n\n"
     "_Encoder._dict's loop over a dict of str keys; None when the Python path must do it."},
    {"first_leaves", (PyCFunction)(void (*)(void))first_leaves, METH_FASTCALL,
     "first_leaves(items, leaves) -> bool\n\n"
     "Mark the plain leaves of a list or tuple met for the first time (leaves[id] = -1);\n"
     "False, with leaves unchanged, when the Python path must do the list."},
#if defined(CLOCK_MONOTONIC)
    {"hand_over", hand_over, METH_O,
     "hand_over(budget_ns) -> bool\n\n"
     "Let go of the GIL and yield the core until another thread takes it or budget_ns\n"
     "pass, then take it back; True when another thread was seen taking it."},
#endif
    {"numbers", numbers, METH_O,
     "numbers(list) -> (dtype name, bytes, shuffled) | None\n\n"
     "A list of exact ints (within int64) or exact floats as the codec's narrowed,\n"
     "byte-shuffled array; None for any other list."},
    {"take_dict", (PyCFunction)(void (*)(void))take_dict, METH_FASTCALL,
     "take_dict(value, out, memo, taken_cls, take, pending, same, plain) -> nbytes | None\n\n"
     "codec.snapshot's loop over a dict of str keys, into out; None when the Python loop\n"
     "must do it."},
    {"take_object", (PyCFunction)(void (*)(void))take_object_entry, METH_FASTCALL,
     "take_object(value, memo, taken_cls, take, pending, same, plain) -> (copy, nbytes) | None\n\n"
     "codec.snapshot's copy of an object of a class in plain; None when the Python path\n"
     "must take it."},
    {"fill_taken", (PyCFunction)(void (*)(void))fill_taken, METH_FASTCALL,
     "fill_taken(pending, threads) -> list of indices\n\n"
     "Give each pending (list, TakenList) what numbers(list) gives, reading the lists on\n"
     "up to `threads` threads; the indices of those numbers() does not take."},
    {"arenas_ahead", arenas_ahead, METH_O,
     "arenas_ahead(on) -> bool\n\n"
     "A load begins (on) or ends: while one runs, pymalloc's arenas are mapped and their\n"
     "pages written ahead on a thread of their own; whether the allocator is installed\n"
     "(on) or was put back (off)."},
    {"stored_list", (PyCFunction)(void (*)(void))stored_list, METH_FASTCALL,
     "stored_list(data, dtype, shuffled) -> list | None\n\n"
     "The list of Python numbers a stored numeric array holds (its bytes little-endian,\n"
     "in byte planes when shuffled), as numpy's tolist gives them; None for a dtype it\n"
     "does not take or bytes that are not whole items."},
    {"texts_holding", (PyCFunction)(void (*)(void))texts_holding, METH_FASTCALL,
     "texts_holding(parts, needle, folded, also) -> list of indices\n\n"
     "The indices of the buffers in parts that hold needle (ASCII case folded when\n"
     "folded; the needle already lower-case) or any bytes of the tuple also, searched\n"
     "with the GIL released."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "archive_manager.codec._native",
    "The codec's numeric-list conversion and the search's prefilter in C.", -1, methods,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    queue_prefix = PyUnicode_InternFromString("_queue_");
    attr_dtype = PyUnicode_InternFromString("dtype");
    attr_data = PyUnicode_InternFromString("data");
    attr_shuffled = PyUnicode_InternFromString("shuffled");
    attr_length = PyUnicode_InternFromString("length");
    if (queue_prefix == NULL || attr_dtype == NULL || attr_data == NULL ||
        attr_shuffled == NULL || attr_length == NULL) {
        return NULL;
    }
    if (PyType_Ready(&slab_type) < 0) {
        return NULL;
    }
    ahead_init();
    for (int c = 0; c < 256; c++) {
        SAME[c] = (unsigned char)c;
        FOLD[c] = (unsigned char)(('A' <= c && c <= 'Z') ? c - 'A' + 'a' : c);
    }
    return PyModule_Create(&module);
}
