/* The two loops that decide how fast streamtap decodes, in C.
 *
 * Each does, for the common shape of its stream, exactly what the Python loop beside it
 * (sse.py's _lf_run, eventstream.py's _decode) does, and hands every other case back to
 * that Python code: they check nothing the Python code does not check, and never report an
 * error themselves. Tests compare the two loops on generated streams, for any chunking and
 * size limit. Without a C compiler the package builds without this module and the Python
 * loops do all the work; STREAMTAP_PURE_PYTHON=1 makes them do it anyway (see accel.py).
 *
 * Beside the loops, each decoder's feed for reads that complete no event (see SSEFeed below).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

/* A named tuple of `count` fields taken from `fields` (references stolen). Building it
 * straight from the type's allocator is what tuple.__new__(cls, fields) does inside. */
static PyObject *
new_event(PyTypeObject *cls, PyObject **fields, Py_ssize_t count)
{
    PyObject *event;
#if PY_VERSION_HEX < 0x030E0000
    event = cls->tp_alloc(cls, count);
    if (event == NULL) {
        for (Py_ssize_t i = 0; i < count; i++)
            Py_XDECREF(fields[i]);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++)
        PyTuple_SET_ITEM(event, i, fields[i]);
#else
    /* newer tuples carry state of their own (a cached hash): let tuple.__new__ set it.
     * Not built or tested here: the project runs on 3.12; the branch above holds for 3.12 and 3.13. */
    PyObject *plain = PyTuple_New(count);
    if (plain == NULL) {
        for (Py_ssize_t i = 0; i < count; i++)
            Py_XDECREF(fields[i]);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++)
        PyTuple_SET_ITEM(plain, i, fields[i]);
    PyObject *args = PyTuple_Pack(1, plain);
    Py_DECREF(plain);
    if (args == NULL)
        return NULL;
    event = PyTuple_Type.tp_new(cls, args, NULL);
    Py_DECREF(args);
#endif
    return event;
}

/* An int argument that fits in a long long, into *out: 1. Anything else (not an int, out of
 * range): 0, with no exception set, so the caller hands the read back to the Python loop,
 * which compares Python ints and has no range. */
static int
small_int(PyObject *value, long long *out)
{
    int overflow = 0;
    if (!PyLong_Check(value))
        return 0;
    *out = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow != 0 || (*out == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* Offsets and sequence numbers below this leave room to add any read's length and event count
 * without overflowing (a stream would need 2**62 bytes to get near it). */
#define FAR_OFFSET (LLONG_MAX / 2)

static int
any_null(PyObject **fields, Py_ssize_t count)
{
    for (Py_ssize_t i = 0; i < count; i++)
        if (fields[i] == NULL)
            return 1;
    return 0;
}

/* One event of the LF-only shape at `p`: optional "event: T\n", then "data: D\n\n".
 * Returns where it ends, or -1 when the bytes at `p` are not that shape. */
static Py_ssize_t
lf_event_at(const char *s, Py_ssize_t p, Py_ssize_t done,
            Py_ssize_t *type_at, Py_ssize_t *type_len, Py_ssize_t *data_at, Py_ssize_t *data_len)
{
    Py_ssize_t q = p;
    *type_at = p;
    *type_len = 0;
    if (done - p >= 7 && memcmp(s + p, "event: ", 7) == 0) {
        const char *nl = memchr(s + p + 7, '\n', done - p - 7);
        if (nl == NULL)
            return -1;
        *type_at = p + 7;
        *type_len = (nl - s) - (p + 7);
        q = (nl - s) + 1;
    }
    if (done - q < 6 || memcmp(s + q, "data: ", 6) != 0)
        return -1;
    const char *nl = memchr(s + q + 6, '\n', done - q - 6);
    if (nl == NULL)
        return -1;
    Py_ssize_t data_end = nl - s;
    if (data_end + 1 >= done || s[data_end + 1] != '\n')
        return -1;
    *data_at = q + 6;
    *data_len = data_end - (q + 6);
    return data_end + 2;
}

PyDoc_STRVAR(sse_lf_events_doc,
"sse_lf_events(work, done, seq, span_start, offset, before, limit, last_event_id, span_retry,\n"
"              prefix, type_names, event_class)\n"
"--\n\n"
"The events of work[:done] when it is a run of LF-only events (see SSEDecoder._lf_run):\n"
"a list; None when it is not, or an event is oversize or not UTF-8; False when an event\n"
"type is missing from type_names (the Python path names it).");

static PyObject *
sse_lf_events(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "sse_lf_events takes 12 arguments");
        return NULL;
    }
    PyObject *work = args[0];
    PyObject *last_event_id = args[7], *span_retry = args[8], *prefix = args[9];
    PyObject *type_names = args[10];
    if (!PyBytes_CheckExact(work) || !PyBytes_CheckExact(prefix) || !PyDict_CheckExact(type_names)
        || !PyType_Check(args[11]) || !PyType_IsSubtype((PyTypeObject *)args[11], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "sse_lf_events: bad argument types");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[11];
    long long done, seq, span_start, offset, before, limit;
    if (!small_int(args[1], &done) || !small_int(args[2], &seq) || !small_int(args[3], &span_start)
        || !small_int(args[4], &offset) || !small_int(args[5], &before))
        Py_RETURN_NONE;
    if (!PyLong_Check(args[6]))
        Py_RETURN_NONE;
    int overflow = 0;
    limit = PyLong_AsLongLongAndOverflow(args[6], &overflow);
    if (limit == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (overflow < 0)
        Py_RETURN_NONE;
    if (overflow > 0)
        limit = LLONG_MAX;  /* a limit too large for C is no limit at all */
    if (done < 0 || done > PyBytes_GET_SIZE(work) || seq < 0 || seq > FAR_OFFSET || span_start < 0
        || offset < span_start || offset > FAR_OFFSET || before < 0 || before > FAR_OFFSET)
        Py_RETURN_NONE;
    const char *s = PyBytes_AS_STRING(work);

    /* First pass: the shape and the sizes, and is every type named? Nothing is built yet. */
    Py_ssize_t count = 0, first_size = 0, largest = 0;
    Py_ssize_t ta, tl, da, dl;
    const char *known_at = NULL;  /* the last type found in type_names */
    Py_ssize_t known_len = -1;
    for (Py_ssize_t p = 0; p < done;) {
        Py_ssize_t end = lf_event_at(s, p, (Py_ssize_t)done, &ta, &tl, &da, &dl);
        if (end < 0)
            Py_RETURN_NONE;
        Py_ssize_t size = end - p;
        if (count == 0)
            first_size = size;
        if (size > largest)
            largest = size;
        if (known_at == NULL || tl != known_len || memcmp(s + ta, known_at, tl) != 0) {
            PyObject *key = PyBytes_FromStringAndSize(s + ta, tl);
            if (key == NULL)
                return NULL;
            int found = PyDict_Contains(type_names, key);
            Py_DECREF(key);
            if (found < 0)
                return NULL;
            if (!found)
                Py_RETURN_FALSE;
            known_at = s + ta;
            known_len = tl;
        }
        count++;
        p = end;
    }
    if (count == 0)
        Py_RETURN_NONE;
    if (before + done > limit && (before + first_size > limit || largest > limit))
        Py_RETURN_NONE;  /* the line path reports oversize events */

    PyObject *events = PyList_New(count);
    if (events == NULL)
        return NULL;
    PyObject *id_ = last_event_id;
    const char *name_at = NULL;  /* the last type looked up, and its name */
    Py_ssize_t name_len = -1;
    PyObject *name = NULL;  /* held: a finalizer run by an allocation below could change type_names */
    Py_ssize_t p = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t end = lf_event_at(s, p, (Py_ssize_t)done, &ta, &tl, &da, &dl);
        if (name == NULL || tl != name_len || memcmp(s + ta, name_at, tl) != 0) {
            PyObject *key = PyBytes_FromStringAndSize(s + ta, tl);
            if (key == NULL)
                goto error;
            Py_CLEAR(name);
            name = Py_XNewRef(PyDict_GetItemWithError(type_names, key));
            Py_DECREF(key);
            if (name == NULL) {
                if (PyErr_Occurred())
                    goto error;
                Py_DECREF(events);
                Py_RETURN_FALSE;
            }
            name_at = s + ta;
            name_len = tl;
        }
        PyObject *text = PyUnicode_DecodeUTF8(s + da, dl, NULL);
        if (text == NULL) {
            if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                PyErr_Clear();
                Py_DECREF(name);
                Py_DECREF(events);
                Py_RETURN_NONE;  /* the line path counts the replacements */
            }
            goto error;
        }
        PyObject *raw;
        if (i == 0 && PyBytes_GET_SIZE(prefix) > 0) {
            Py_ssize_t head = PyBytes_GET_SIZE(prefix);
            raw = PyBytes_FromStringAndSize(NULL, head + end - p);
            if (raw != NULL) {
                memcpy(PyBytes_AS_STRING(raw), PyBytes_AS_STRING(prefix), head);
                memcpy(PyBytes_AS_STRING(raw) + head, s + p, end - p);
            }
        }
        else
            raw = PyBytes_FromStringAndSize(s + p, end - p);
        PyObject *fields[9] = {
            PyLong_FromLongLong(seq + i),
            PyLong_FromLongLong(i == 0 ? span_start : offset + p),
            PyLong_FromLongLong(offset + end),
            raw,
            Py_NewRef(name),
            text,
            Py_NewRef(id_),
            Py_NewRef(i == 0 ? span_retry : Py_None),
            PyLong_FromLong(0),
        };
        if (any_null(fields, 9)) {
            for (int k = 0; k < 9; k++)
                Py_XDECREF(fields[k]);
            goto error;
        }
        PyObject *event = new_event(cls, fields, 9);
        if (event == NULL)
            goto error;
        PyList_SET_ITEM(events, i, event);
        p = end;
    }
    Py_XDECREF(name);
    return events;
error:
    Py_XDECREF(name);
    Py_DECREF(events);
    return NULL;
}

PyDoc_STRVAR(eventstream_known_frames_doc,
"eventstream_known_frames(head, pos, base, first_seq, limit, layouts, message_class, events)\n"
"--\n\n"
"Appends to events every whole message from head[pos:] on whose prelude and header block\n"
"are a known layout and whose message CRC holds (see EventStreamDecoder._decode), and\n"
"returns where it stopped: the first message the Python loop must look at. A message's\n"
"seq is first_seq + its place in events.");

static PyObject *
eventstream_known_frames(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "eventstream_known_frames takes 8 arguments");
        return NULL;
    }
    PyObject *head = args[0], *layouts = args[5], *events = args[7];
    if (!PyBytes_CheckExact(head) || !PyDict_CheckExact(layouts) || !PyList_CheckExact(events)
        || !PyType_Check(args[6]) || !PyType_IsSubtype((PyTypeObject *)args[6], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "eventstream_known_frames: bad argument types");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[6];
    long long pos, base, first_seq, limit;
    const unsigned char *s = (const unsigned char *)PyBytes_AS_STRING(head);
    Py_ssize_t size = PyBytes_GET_SIZE(head);
    if (!small_int(args[1], &pos) || pos < 0 || pos > size) {
        PyErr_SetString(PyExc_ValueError, "eventstream_known_frames: pos out of range");
        return NULL;
    }
    if (!small_int(args[2], &base) || !small_int(args[3], &first_seq) || !small_int(args[4], &limit)
        || base < 0 || base > FAR_OFFSET || first_seq < 0 || first_seq > FAR_OFFSET)
        return PyLong_FromLongLong(pos);  /* the Python loop takes every frame */

    while (size - pos >= 12) {
        PyObject *prelude = PyBytes_FromStringAndSize((const char *)s + pos, 12);
        if (prelude == NULL)
            return NULL;
        /* held: a finalizer run by an allocation below could change layouts */
        PyObject *layout = Py_XNewRef(PyDict_GetItemWithError(layouts, prelude));
        Py_DECREF(prelude);
        if (layout == NULL) {
            if (PyErr_Occurred())
                return NULL;
            break;
        }
        if (!PyTuple_CheckExact(layout) || PyTuple_GET_SIZE(layout) != 5) {
            Py_DECREF(layout);
            break;
        }
        PyObject *block = PyTuple_GET_ITEM(layout, 3);
        PyObject *headers = PyTuple_GET_ITEM(layout, 4);
        Py_ssize_t block_len = PyBytes_CheckExact(block) ? PyBytes_GET_SIZE(block) : -1;
        if (block_len < 0 || !PyDict_CheckExact(headers) || size - pos - 12 < block_len
            || memcmp(s + pos + 12, PyBytes_AS_STRING(block), block_len) != 0) {
            Py_DECREF(layout);
            break;
        }
        long long total, headers_end, prefix_crc;
        if (!small_int(PyTuple_GET_ITEM(layout, 0), &total) || !small_int(PyTuple_GET_ITEM(layout, 1), &headers_end)
            || !small_int(PyTuple_GET_ITEM(layout, 2), &prefix_crc) || prefix_crc < 0 || prefix_crc > 0xffffffffLL) {
            Py_DECREF(layout);
            break;
        }
        /* no sum of two values: a layout is not trusted not to overflow one */
        if (total > limit || total > size - pos || headers_end != 12 + block_len || headers_end > total - 4) {
            Py_DECREF(layout);
            break;  /* the Python loop waits for the rest, or reports the error */
        }
        Py_ssize_t end = (Py_ssize_t)pos + (Py_ssize_t)total;
        const unsigned char *crc_at = s + end - 4;
        unsigned long expected = ((unsigned long)crc_at[0] << 24) | ((unsigned long)crc_at[1] << 16)
                                 | ((unsigned long)crc_at[2] << 8) | (unsigned long)crc_at[3];
        Py_ssize_t payload_len = (Py_ssize_t)total - (Py_ssize_t)headers_end - 4;
        /* payload_len < total <= limit <= 16 MiB (the protocol's bound, applied by the caller): fits a uInt */
        unsigned long crc = crc32((unsigned long)prefix_crc, s + pos + headers_end, (uInt)payload_len);
        if ((crc & 0xffffffffUL) != expected) {
            Py_DECREF(layout);
            break;  /* the Python loop reports the mismatch */
        }
        PyObject *fields[6] = {
            PyLong_FromLongLong(first_seq + PyList_GET_SIZE(events)),
            PyLong_FromLongLong(base + pos),
            PyLong_FromLongLong(base + end),
            PyBytes_FromStringAndSize((const char *)s + pos, end - pos),
            PyDict_Copy(headers),
            PyBytes_FromStringAndSize((const char *)s + pos + headers_end, payload_len),
        };
        Py_DECREF(layout);
        if (any_null(fields, 6)) {
            for (int k = 0; k < 6; k++)
                Py_XDECREF(fields[k]);
            return NULL;
        }
        PyObject *message = new_event(cls, fields, 6);
        if (message == NULL)
            return NULL;
        int failed = PyList_Append(events, message);
        Py_DECREF(message);
        if (failed)
            return NULL;
        pos = end;
    }
    return PyLong_FromSsize_t(pos);
}

/* ---- the decoders' feed for reads that complete no event ---------------------------------
 *
 * A read too short to finish an event is mostly only appended to the decoder's buffer, and for
 * such reads (one byte at a time, at worst) the cost of entering a Python method is most of the
 * work. SSEFeed and EventStreamFeed are the bases of SSEDecoder and EventStreamDecoder: they hold
 * the few fields that decide that case, under the Python decoder's own names, so the decoder's
 * Python code reads and writes them as it always did and there is no copy to keep in step. Their
 * `feed` makes the same tests the Python code makes first, appends the read where that code
 * would only append it (SSE: a read with no line end, or, between events, line ends that end no
 * event; event-stream: a read that leaves the next step short, or completes a valid prelude and
 * not its message, where the step only learns the message's length), and hands every other read
 * (or argument) to `_feed`. */

/* the Python modules' constants (a test holds them to these): */
#define SSE_HOLD 4096 /* sse.py's _HOLD: an unfinished event up to this size is kept unparsed */
#define PRELUDE_LENGTH 12 /* eventstream.py's */
#define MIN_MESSAGE_LENGTH 16
#define MAX_HEADERS_LENGTH (128 * 1024)
#define MAX_PAYLOAD_LENGTH (24 * 1024 * 1024)

typedef struct {
    PyObject *feed_name; /* "_feed", interned */
} accel_state;

/* What both bases hold: the decoder's buffer, and the length that bounds it. */
typedef struct {
    PyObject_HEAD
    PyObject *buffer;  /* the bytes not parsed yet, a bytearray: SSE's _buf, event-stream's _buffer */
    Py_ssize_t length; /* SSE's _buf_room: the length of _buf beyond which the event is oversize;
                        * event-stream's _need: the length of _buffer the next step needs */
    PyObject *no_events; /* the empty list feed returned last, given again once its caller let go */
} Feed;

typedef struct {
    Feed feed;
    char quick;          /* _quick: a read with no CR or LF may just be appended */
    char between_events; /* _between_events: no event half parsed, _buf holds a whole event's start */
} SSEFeed;

typedef struct {
    Feed feed;
    Py_ssize_t limit; /* max_message_length */
    char decoding;    /* _decoding: neither stopped at an error nor closed */
} EventStreamFeed;

static struct PyModuleDef accel_module;

/* The decoder's Python `_feed(data)`: every read the C test does not take. (A METH_O method is
 * what CPython's calls specialise, so the module comes from the type here, on this slower path.) */
static PyObject *
python_feed(PyObject *self, PyObject *data)
{
    PyObject *module = PyType_GetModuleByDef(Py_TYPE(self), &accel_module);
    if (module == NULL)
        return NULL;
    accel_state *state = PyModule_GetState(module);
    return PyObject_CallMethodOneArg(self, state->feed_name, data);
}

/* An empty list of events. Making a new list and freeing it again was a fifth of a 1-byte read's
 * cost, so the one returned last is returned again when nothing else holds it and it is still
 * empty: the caller cannot tell (CPython's zip and enumerate reuse their result tuples so). */
static PyObject *
no_events(Feed *self)
{
    PyObject *list = self->no_events;
#ifndef Py_GIL_DISABLED /* there another thread may take a reference while this one looks */
    if (list != NULL && Py_REFCNT(list) == 1 && PyList_GET_SIZE(list) == 0)
        return Py_NewRef(list);
#endif
    list = PyList_New(0);
    if (list != NULL)
        Py_XSETREF(self->no_events, Py_NewRef(list));
    return list;
}

/* `data` appended to the bytearray `buffer` of `have` bytes, and the empty list of events. */
static PyObject *
appended(Feed *self, PyObject *buffer, Py_ssize_t have, PyObject *data)
{
    Py_ssize_t size = PyBytes_GET_SIZE(data);
    if (PyByteArray_Resize(buffer, have + size) < 0)
        return NULL;
    memcpy(PyByteArray_AS_STRING(buffer) + have, PyBytes_AS_STRING(data), size);
    return no_events(self);
}

PyDoc_STRVAR(feed_doc, "feed(data) -> list of the events data completes");

/* Is there a blank line, LF LF, from the LF at `lf` on, before `end`? */
static int
blank_line_from(const char *lf, const char *end)
{
    while (++lf < end) {
        if (*lf == '\n')
            return 1;
        if ((lf = memchr(lf, '\n', end - lf)) == NULL)
            return 0;
    }
    return 0;
}

static PyObject *
sse_feed(SSEFeed *self, PyObject *data)
{
    PyObject *buffer = self->feed.buffer;
    if (self->quick && buffer != NULL && PyByteArray_CheckExact(buffer) && PyBytes_CheckExact(data)) {
        Py_ssize_t have = PyByteArray_GET_SIZE(buffer), size = PyBytes_GET_SIZE(data);
        const char *bytes = PyBytes_AS_STRING(data);
        if (have + size <= self->feed.length && memchr(bytes, '\r', size) == NULL) {
            const char *lf = memchr(bytes, '\n', size);
            if (lf == NULL)
                return appended(&self->feed, buffer, have, data);
            /* between events, line ends that make no blank line end nothing: the event waits whole */
            if (self->between_events && have + size <= SSE_HOLD && !blank_line_from(lf, bytes + size)
                && !(bytes[0] == '\n' && have > 0 && PyByteArray_AS_STRING(buffer)[have - 1] == '\n'))
                return appended(&self->feed, buffer, have, data);
        }
    }
    return python_feed((PyObject *)self, data);
}

static uint32_t
big_endian_u32(const unsigned char *bytes)
{
    return (uint32_t)bytes[0] << 24 | (uint32_t)bytes[1] << 16 | (uint32_t)bytes[2] << 8 | bytes[3];
}

static PyObject *
eventstream_feed(EventStreamFeed *self, PyObject *data)
{
    PyObject *buffer = self->feed.buffer;
    if (buffer != NULL && PyByteArray_CheckExact(buffer) && PyBytes_CheckExact(data)) {
        Py_ssize_t have = PyByteArray_GET_SIZE(buffer), size = PyBytes_GET_SIZE(data);
        if (have + size < self->feed.length)
            return appended(&self->feed, buffer, have, data);
        /* The read completes a prelude (while decoding, the buffer starts at a message whenever
         * the next step needs a prelude) but not its message: that step only checks the prelude
         * and learns the message's length. Any prelude it would refuse goes to Python, which
         * reports it. The CRC is tested last: a read holding the whole message goes to Python.
         * (headers_length <= total - 16 also says total >= 16, the least a message is.) */
        if (self->decoding && self->feed.length == PRELUDE_LENGTH && have < PRELUDE_LENGTH) {
            unsigned char prelude[PRELUDE_LENGTH];
            memcpy(prelude, PyByteArray_AS_STRING(buffer), have);
            memcpy(prelude + have, PyBytes_AS_STRING(data), PRELUDE_LENGTH - have);
            long long total = big_endian_u32(prelude), headers_length = big_endian_u32(prelude + 4);
            if (have + size < total && total <= (long long)self->limit
                && headers_length <= total - MIN_MESSAGE_LENGTH && headers_length <= MAX_HEADERS_LENGTH
                && total - MIN_MESSAGE_LENGTH - headers_length <= MAX_PAYLOAD_LENGTH
                && crc32(0, prelude, 8) == big_endian_u32(prelude + 8)) {
                PyObject *events = appended(&self->feed, buffer, have, data);
                if (events != NULL)
                    self->feed.length = total;
                return events;
            }
        }
    }
    return python_feed((PyObject *)self, data);
}

/* The length field, under its decoder's name (the closure): any int, kept within Py_ssize_t (an
 * event size limit may be set beyond it; no buffer reaches either end, so the comparisons come
 * out the same; they add a buffer's length to a read's, which cannot overflow, and subtract
 * nothing from the field, which could). */
static PyObject *
get_length(Feed *self, void *name)
{
    return PyLong_FromSsize_t(self->length);
}

static int
set_length(Feed *self, PyObject *value, void *name)
{
    if (value == NULL || !PyLong_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int", (const char *)name);
        return -1;
    }
    int overflow = 0;
    long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (number == -1 && PyErr_Occurred())
        return -1;
    if (overflow > 0 || number > PY_SSIZE_T_MAX)
        number = PY_SSIZE_T_MAX;
    else if (overflow < 0 || number < PY_SSIZE_T_MIN)
        number = PY_SSIZE_T_MIN;
    self->length = (Py_ssize_t)number;
    return 0;
}

/* The garbage collector sees the list of no events: a caller may put the decoder in it. */
static int
feed_traverse(Feed *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->buffer);
    Py_VISIT(self->no_events);
    return 0;
}

static int
feed_clear(Feed *self)
{
    Py_CLEAR(self->buffer);
    Py_CLEAR(self->no_events);
    return 0;
}

static void
feed_dealloc(Feed *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    feed_clear(self);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyMethodDef sse_feed_methods[] = {
    {"feed", (PyCFunction)sse_feed, METH_O, feed_doc},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef eventstream_feed_methods[] = {
    {"feed", (PyCFunction)eventstream_feed, METH_O, feed_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef sse_feed_members[] = {
    {"_buf", Py_T_OBJECT_EX, offsetof(Feed, buffer), 0, NULL},
    {"_quick", Py_T_BOOL, offsetof(SSEFeed, quick), 0, NULL},
    {"_between_events", Py_T_BOOL, offsetof(SSEFeed, between_events), 0, NULL},
    {NULL},
};

static PyMemberDef eventstream_feed_members[] = {
    {"_buffer", Py_T_OBJECT_EX, offsetof(Feed, buffer), 0, NULL},
    {"max_message_length", Py_T_PYSSIZET, offsetof(EventStreamFeed, limit), 0, NULL},
    {"_decoding", Py_T_BOOL, offsetof(EventStreamFeed, decoding), 0, NULL},
    {NULL},
};

static PyGetSetDef sse_feed_getset[] = {
    {"_buf_room", (getter)get_length, (setter)set_length, NULL, "_buf_room"},
    {NULL},
};

static PyGetSetDef eventstream_feed_getset[] = {
    {"_need", (getter)get_length, (setter)set_length, NULL, "_need"},
    {NULL},
};

static PyType_Slot sse_feed_slots[] = {
    {Py_tp_doc, "The base of SSEDecoder: its feed for reads that complete no event (see _accel.c)."},
    {Py_tp_dealloc, feed_dealloc},
    {Py_tp_traverse, feed_traverse},
    {Py_tp_clear, feed_clear},
    {Py_tp_methods, sse_feed_methods},
    {Py_tp_members, sse_feed_members},
    {Py_tp_getset, sse_feed_getset},
    {0, NULL},
};

static PyType_Slot eventstream_feed_slots[] = {
    {Py_tp_doc, "The base of EventStreamDecoder: its feed for reads that complete no event (see _accel.c)."},
    {Py_tp_dealloc, feed_dealloc},
    {Py_tp_traverse, feed_traverse},
    {Py_tp_clear, feed_clear},
    {Py_tp_methods, eventstream_feed_methods},
    {Py_tp_members, eventstream_feed_members},
    {Py_tp_getset, eventstream_feed_getset},
    {0, NULL},
};

static PyType_Spec sse_feed_spec = {
    .name = "streamtap.wire._accel.SSEFeed",
    .basicsize = sizeof(SSEFeed),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = sse_feed_slots,
};

static PyType_Spec eventstream_feed_spec = {
    .name = "streamtap.wire._accel.EventStreamFeed",
    .basicsize = sizeof(EventStreamFeed),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = eventstream_feed_slots,
};

static int
accel_exec(PyObject *module)
{
    accel_state *state = PyModule_GetState(module);
    state->feed_name = PyUnicode_InternFromString("_feed");
    if (state->feed_name == NULL)
        return -1;
    if (PyModule_AddIntConstant(module, "SSE_HOLD", SSE_HOLD) < 0
        || PyModule_AddIntConstant(module, "PRELUDE_LENGTH", PRELUDE_LENGTH) < 0
        || PyModule_AddIntConstant(module, "MIN_MESSAGE_LENGTH", MIN_MESSAGE_LENGTH) < 0
        || PyModule_AddIntConstant(module, "MAX_HEADERS_LENGTH", MAX_HEADERS_LENGTH) < 0
        || PyModule_AddIntConstant(module, "MAX_PAYLOAD_LENGTH", MAX_PAYLOAD_LENGTH) < 0)
        return -1;
    PyType_Spec *specs[] = {&sse_feed_spec, &eventstream_feed_spec};
    for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++) {
        PyObject *type = PyType_FromModuleAndSpec(module, specs[i], NULL);
        if (type == NULL || PyModule_AddType(module, (PyTypeObject *)type) < 0) {
            Py_XDECREF(type);
            return -1;
        }
        Py_DECREF(type);
    }
    return 0;
}

static int
accel_traverse(PyObject *module, visitproc visit, void *arg)
{
    accel_state *state = PyModule_GetState(module);
    if (state != NULL)
        Py_VISIT(state->feed_name);
    return 0;
}

static int
accel_clear(PyObject *module)
{
    accel_state *state = PyModule_GetState(module);
    if (state != NULL)
        Py_CLEAR(state->feed_name);
    return 0;
}

static void
accel_free(void *module)
{
    accel_clear((PyObject *)module);
}

static PyMethodDef accel_methods[] = {
    {"sse_lf_events", (PyCFunction)(void (*)(void))sse_lf_events, METH_FASTCALL, sse_lf_events_doc},
    {"eventstream_known_frames", (PyCFunction)(void (*)(void))eventstream_known_frames, METH_FASTCALL,
     eventstream_known_frames_doc},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot accel_slots[] = {
    {Py_mod_exec, accel_exec},
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
#ifdef Py_mod_gil
    /* the loops read dicts through borrowed references: they rely on the GIL */
    {Py_mod_gil, Py_MOD_GIL_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef accel_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "streamtap.wire._accel",
    .m_doc = "The hot loops of the SSE and event-stream decoders, and their feed for short reads, in C.",
    .m_size = sizeof(accel_state),
    .m_methods = accel_methods,
    .m_slots = accel_slots,
    .m_traverse = accel_traverse,
    .m_clear = accel_clear,
    .m_free = accel_free,
};

PyMODINIT_FUNC
PyInit__accel(void)
{
    return PyModuleDef_Init(&accel_module);
}
