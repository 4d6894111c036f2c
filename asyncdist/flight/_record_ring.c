/* The flight recorder's ring in C: the part that runs for every operation.
 *
 * asyncdist/flight/record_ring.py holds the same ring in Python (PyRecordRing), the
 * fallback where this did not build, and says what each method means; the
 * two pass the same tests (tests/flight/test_record_ring.py). This one exists for
 * speed alone: a record is a C struct in a preallocated array, so an
 * operation allocates no Python object but its serial number, and the ring
 * frees nothing cold when it overwrites a record (the Python ring's lists
 * cost about 1 us of the 2 us a record took there; docs/benchmarks.md,
 * "Flight recorder cost").
 *
 * Loop thread only, like every caller; each method holds the GIL, so
 * entries() is a consistent snapshot from any thread.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

/* One operation. The objects are owned references (NULL: none). */
typedef struct {
    long long serial; /* -1: the slot was never used */
    long long ctx, seq, nbytes;
    double posted, started, ended; /* loop times; NAN: not yet */
    PyObject *kind, *group, *desc, *peers;
    PyObject *step;    /* what says whom it waits on; dropped as it ends */
    PyObject *stat;    /* its description's counter: [count, seconds] */
    PyObject *error;   /* str, once failed */
    PyObject *awaited; /* frozen by a failure */
} Record;

#define RECORD_OBJECTS 8

/* Where a record's objects are, to visit, clear or replace them all. */
static void record_objects(Record *r, PyObject **out[RECORD_OBJECTS]) {
    out[0] = &r->kind;
    out[1] = &r->group;
    out[2] = &r->desc;
    out[3] = &r->peers;
    out[4] = &r->step;
    out[5] = &r->stat;
    out[6] = &r->error;
    out[7] = &r->awaited;
}

typedef struct {
    PyObject_HEAD
    Py_ssize_t capacity;
    long long count; /* operations recorded so far */
    Record *records;
    PyObject *ops;     /* context -> description -> [count, seconds] */
    PyObject *evicted; /* serial -> (stat, posted): records overwritten while still open */
    long long last_ctx;
    PyObject *last_desc, *last_stat; /* the last operation's: the next is most often the same call */
} RecordRing;

/* time.monotonic(), the loop's clock, read as Python reads it: through its
 * public clock API from 3.13, and before that where it is CLOCK_MONOTONIC
 * (Linux); elsewhere this file does not build and the Python ring serves. */
#if PY_VERSION_HEX >= 0x030D0000
static double monotonic(void) {
    PyTime_t t;
    if (PyTime_Monotonic(&t) < 0) { /* it cannot fail once Python has started */
        PyErr_Clear();
        return NAN;
    }
    return PyTime_AsSecondsDouble(t);
}
#elif defined(__linux__)
#include <time.h>
static double monotonic(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)((long long)ts.tv_sec * 1000000000LL + ts.tv_nsec) / 1e9;
}
#else
#error "the C ring reads time.monotonic's clock only on Linux before Python 3.13"
#endif

static PyObject *as_float_or_none(double value) {
    return isnan(value) ? Py_NewRef(Py_None) : PyFloat_FromDouble(value);
}

static PyObject *ref_or_none(PyObject *obj) { return Py_NewRef(obj != NULL ? obj : Py_None); }

/* The record of `serial`, or NULL if the ring has overwritten it (or never held it). */
static Record *find(RecordRing *self, long long serial) {
    if (serial < 0 || serial >= self->count || serial < self->count - self->capacity) return NULL;
    Record *r = &self->records[serial % self->capacity];
    return r->serial == serial ? r : NULL;
}

/* Count one ended operation of `seconds` into its description's [count, seconds]. */
static int count_into(PyObject *stat, double seconds) {
    if (!PyList_CheckExact(stat) || PyList_GET_SIZE(stat) != 2) {
        PyErr_SetString(PyExc_TypeError, "an ops counter must be a list [count, seconds]");
        return -1;
    }
    long long count = PyLong_AsLongLong(PyList_GET_ITEM(stat, 0));
    if (count == -1 && PyErr_Occurred()) return -1;
    double total = PyFloat_AsDouble(PyList_GET_ITEM(stat, 1));
    if (total == -1.0 && PyErr_Occurred()) return -1;
    PyObject *new_count = PyLong_FromLongLong(count + 1);
    PyObject *new_total = PyFloat_FromDouble(total + seconds);
    if (new_count == NULL || new_total == NULL) {
        Py_XDECREF(new_count);
        Py_XDECREF(new_total);
        return -1;
    }
    PyList_SetItem(stat, 0, new_count);
    PyList_SetItem(stat, 1, new_total);
    return 0;
}

static int Ring_init(RecordRing *self, PyObject *args, PyObject *kwds) {
    static char *keywords[] = {"capacity", "ops", NULL};
    Py_ssize_t capacity;
    PyObject *ops;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nO!:RecordRing", keywords, &capacity, &PyDict_Type, &ops)) return -1;
    if (capacity < 0) {
        PyErr_SetString(PyExc_ValueError, "capacity must be >= 0");
        return -1;
    }
    if (self->records != NULL) {
        PyErr_SetString(PyExc_TypeError, "a RecordRing is initialised once");
        return -1;
    }
    self->records = PyMem_Calloc(capacity ? capacity : 1, sizeof(Record));
    self->evicted = PyDict_New();
    if (self->records == NULL || self->evicted == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < capacity; i++) self->records[i].serial = -1;
    self->capacity = capacity;
    self->ops = Py_NewRef(ops);
    self->last_ctx = -1;
    return 0;
}

static int Ring_traverse(RecordRing *self, visitproc visit, void *arg) {
    for (Py_ssize_t i = 0; self->records != NULL && i < self->capacity; i++) {
        PyObject **objects[RECORD_OBJECTS];
        record_objects(&self->records[i], objects);
        for (int k = 0; k < RECORD_OBJECTS; k++) Py_VISIT(*objects[k]);
    }
    Py_VISIT(self->ops);
    Py_VISIT(self->evicted);
    Py_VISIT(self->last_desc);
    Py_VISIT(self->last_stat);
    return 0;
}

/* Cleared (by the garbage collector, breaking a cycle), a ring records and finds nothing. */
static int Ring_clear(RecordRing *self) {
    Py_ssize_t capacity = self->capacity;
    self->capacity = 0;
    for (Py_ssize_t i = 0; self->records != NULL && i < capacity; i++) {
        PyObject **objects[RECORD_OBJECTS];
        record_objects(&self->records[i], objects);
        for (int k = 0; k < RECORD_OBJECTS; k++) Py_CLEAR(*objects[k]);
    }
    Py_CLEAR(self->ops);
    Py_CLEAR(self->evicted);
    Py_CLEAR(self->last_desc);
    Py_CLEAR(self->last_stat);
    return 0;
}

static void Ring_dealloc(RecordRing *self) {
    PyObject_GC_UnTrack(self);
    Ring_clear(self);
    PyMem_Free(self->records);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The counter of (ctx, desc) in ops, made at its first operation (a new reference). */
static PyObject *stat_of(RecordRing *self, PyObject *ctx, PyObject *desc) {
    PyObject *fresh = PyDict_New();
    if (fresh == NULL) return NULL;
    PyObject *by_desc = PyDict_SetDefault(self->ops, ctx, fresh); /* borrowed */
    Py_DECREF(fresh);
    if (by_desc == NULL) return NULL;
    PyObject *zero = Py_BuildValue("[id]", 0, 0.0);
    if (zero == NULL) return NULL;
    PyObject *stat = PyDict_SetDefault(by_desc, desc, zero);
    Py_DECREF(zero);
    return Py_XNewRef(stat);
}

/* The record in `r` is overwritten while its operation is open: keep what its end counts. */
static int evict_open(RecordRing *self, Record *r) {
    PyObject *key = PyLong_FromLongLong(r->serial);
    PyObject *value = Py_BuildValue("(Od)", r->stat, r->posted);
    int failed = key == NULL || value == NULL || PyDict_SetItem(self->evicted, key, value) < 0;
    Py_XDECREF(key);
    Py_XDECREF(value);
    return failed ? -1 : 0;
}

static int as_long_long(PyObject *obj, long long *out) {
    *out = PyLong_AsLongLong(obj);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

static int as_double(PyObject *obj, double *out) {
    *out = PyFloat_AsDouble(obj);
    return *out == -1.0 && PyErr_Occurred() ? -1 : 0;
}

/* open(kind, ctx, group, seq, desc, peers, step, posted, started=None, nbytes=-1, /) -> serial | None */
static PyObject *Ring_open(RecordRing *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 8 || nargs > 10) {
        PyErr_Format(PyExc_TypeError, "open() takes from 8 to 10 positional arguments (%zd given)", nargs);
        return NULL;
    }
    if (self->capacity == 0) Py_RETURN_NONE;
    long long ctx, seq, nbytes = -1;
    double posted, started = NAN;
    PyObject *desc = args[4];
    if (as_long_long(args[1], &ctx) < 0 || as_long_long(args[3], &seq) < 0 || as_double(args[7], &posted) < 0)
        return NULL;
    if (nargs > 8 && args[8] != Py_None && as_double(args[8], &started) < 0) return NULL;
    if (nargs > 9 && as_long_long(args[9], &nbytes) < 0) return NULL;
    int same = 0;
    if (ctx == self->last_ctx && self->last_desc != NULL) {
        /* most often the very object: a description is made once per kind of call */
        same = desc == self->last_desc ? 1 : PyObject_RichCompareBool(desc, self->last_desc, Py_EQ);
        if (same < 0) return NULL;
    }
    if (!same) {
        PyObject *stat = stat_of(self, args[1], desc);
        if (stat == NULL) return NULL;
        Py_XSETREF(self->last_stat, stat);
        Py_XSETREF(self->last_desc, Py_NewRef(desc));
        self->last_ctx = ctx;
    }
    long long serial = self->count;
    Record *r = &self->records[serial % self->capacity];
    if (r->serial >= 0 && isnan(r->ended) && evict_open(self, r) < 0) return NULL;
    PyObject *handle = PyLong_FromLongLong(serial);
    if (handle == NULL) return NULL;
    /* The overwritten record's objects are released last: freeing one may run code that reads the ring. */
    PyObject **fields[RECORD_OBJECTS], *old[RECORD_OBJECTS];
    record_objects(r, fields);
    for (int k = 0; k < RECORD_OBJECTS; k++) old[k] = *fields[k];
    r->serial = serial;
    r->ctx = ctx;
    r->seq = seq;
    r->nbytes = nbytes;
    r->posted = posted;
    r->started = started;
    r->ended = NAN;
    r->kind = Py_NewRef(args[0]);
    r->group = Py_NewRef(args[2]);
    r->desc = Py_NewRef(self->last_desc); /* the last one's equal description: the ring holds one, not one per record */
    r->peers = Py_NewRef(args[5]);
    r->step = args[6] == Py_None ? NULL : Py_NewRef(args[6]);
    r->stat = Py_NewRef(self->last_stat);
    r->error = NULL;
    r->awaited = NULL;
    self->count = serial + 1;
    for (int k = 0; k < RECORD_OBJECTS; k++) Py_XDECREF(old[k]);
    return handle;
}

static PyObject *Ring_start(RecordRing *self, PyObject *handle) {
    long long serial;
    if (as_long_long(handle, &serial) < 0) return NULL;
    Record *r = find(self, serial);
    if (r != NULL) r->started = monotonic();
    Py_RETURN_NONE;
}

/* end(handle, error=None, /) -> bool */
static PyObject *Ring_end(RecordRing *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "end() takes 1 or 2 positional arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *error = nargs > 1 && args[1] != Py_None ? args[1] : NULL;
    long long serial;
    if (as_long_long(args[0], &serial) < 0) return NULL;
    double ended = monotonic();
    Record *r = find(self, serial);
    if (r != NULL) {
        if (!isnan(r->ended)) Py_RETURN_FALSE;
        r->ended = ended;
        if (count_into(r->stat, ended - r->posted) < 0) return NULL;
        PyObject *step = r->step, *old_error = r->error;
        r->step = NULL;
        r->error = Py_XNewRef(error);
        Py_XDECREF(step);
        Py_XDECREF(old_error);
        Py_RETURN_TRUE;
    }
    if (self->evicted == NULL) Py_RETURN_FALSE;
    PyObject *key = PyLong_FromLongLong(serial);
    if (key == NULL) return NULL;
    PyObject *kept = PyDict_GetItemWithError(self->evicted, key); /* borrowed */
    if (kept == NULL) {
        Py_DECREF(key);
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_FALSE;
    }
    Py_INCREF(kept);
    double posted;
    int failed = PyDict_DelItem(self->evicted, key) < 0 || as_double(PyTuple_GET_ITEM(kept, 1), &posted) < 0 ||
                 count_into(PyTuple_GET_ITEM(kept, 0), ended - posted) < 0;
    Py_DECREF(kept);
    Py_DECREF(key);
    if (failed) return NULL;
    Py_RETURN_TRUE;
}

static PyObject *record_as_list(Record *r) {
    return Py_BuildValue("[LNLNLNNNNNLNNNNN]", r->serial, ref_or_none(r->kind), r->ctx, ref_or_none(r->group), r->seq,
                         ref_or_none(r->desc), ref_or_none(r->peers), ref_or_none(r->step), Py_NewRef(Py_None),
                         Py_NewRef(Py_None), r->nbytes, as_float_or_none(r->posted), as_float_or_none(r->started),
                         as_float_or_none(r->ended), ref_or_none(r->error), ref_or_none(r->awaited));
}

static PyObject *Ring_entries(RecordRing *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *entries = PyList_New(0);
    if (entries == NULL) return NULL;
    long long first = self->count > self->capacity ? self->count - self->capacity : 0;
    for (long long serial = first; serial < self->count; serial++) {
        PyObject *entry = record_as_list(&self->records[serial % self->capacity]);
        if (entry == NULL || PyList_Append(entries, entry) < 0) {
            Py_XDECREF(entry);
            Py_DECREF(entries);
            return NULL;
        }
        Py_DECREF(entry);
    }
    return entries;
}

static PyObject *Ring_note_awaited(RecordRing *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "note_awaited() takes 2 positional arguments (%zd given)", nargs);
        return NULL;
    }
    long long serial;
    if (as_long_long(args[0], &serial) < 0) return NULL;
    Record *r = find(self, serial);
    if (r != NULL) Py_XSETREF(r->awaited, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

static PyObject *Ring_get_recorded(RecordRing *self, void *Py_UNUSED(closure)) { return PyLong_FromLongLong(self->count); }

static PyObject *Ring_get_capacity(RecordRing *self, void *Py_UNUSED(closure)) { return PyLong_FromSsize_t(self->capacity); }

static PyMethodDef Ring_methods[] = {
    {"open", (PyCFunction)(void (*)(void))Ring_open, METH_FASTCALL,
     "open(kind, ctx, group, seq, desc, peers, step, posted, started=None, nbytes=-1, /)\n--\n\n"
     "Record an operation that begins; its handle, or None when the capacity is 0."},
    {"start", (PyCFunction)Ring_start, METH_O, "start(handle, /)\n--\n\nThe operation's messages flow from now."},
    {"end", (PyCFunction)(void (*)(void))Ring_end, METH_FASTCALL,
     "end(handle, error=None, /)\n--\n\nEnd the operation now, completed or failed; False if it had ended."},
    {"entries", (PyCFunction)Ring_entries, METH_NOARGS, "entries()\n--\n\nThe records kept, oldest first, as lists."},
    {"note_awaited", (PyCFunction)(void (*)(void))Ring_note_awaited, METH_FASTCALL,
     "note_awaited(serial, awaited, /)\n--\n\nWhat the open operation `serial` waits on as a failure happens."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Ring_getset[] = {
    {"recorded", (getter)Ring_get_recorded, NULL, "Operations recorded in all.", NULL},
    {"capacity", (getter)Ring_get_capacity, NULL, "Operations kept.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asyncdist.flight._record_ring.RecordRing",
    .tp_doc = "RecordRing(capacity, ops)\n--\n\nThe last `capacity` operations, counted into `ops` as they end.",
    .tp_basicsize = sizeof(RecordRing),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Ring_init,
    .tp_dealloc = (destructor)Ring_dealloc,
    .tp_traverse = (traverseproc)Ring_traverse,
    .tp_clear = (inquiry)Ring_clear,
    .tp_methods = Ring_methods,
    .tp_getset = Ring_getset,
};

static struct PyModuleDef ring_module = {
    PyModuleDef_HEAD_INIT, .m_name = "asyncdist.flight._record_ring",
    .m_doc = "The flight recorder's ring in C (see asyncdist.flight.record_ring).", .m_size = -1,
};

PyMODINIT_FUNC PyInit__record_ring(void) {
    if (PyType_Ready(&RingType) < 0) return NULL;
    PyObject *module = PyModule_Create(&ring_module);
    if (module == NULL) return NULL;
    if (PyModule_AddObjectRef(module, "RecordRing", (PyObject *)&RingType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
