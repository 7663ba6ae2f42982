/* The recording writer's frame lines in C.
 *
 * writer.py's RecordingWriter.frames() writes one line per wire event, and in the analysis worker
 * that was the largest share of a stream's cost: a hash, a JSON string, a few fields, each a call
 * from Python. `frame_lines` builds, for the common frames, the very bytes the Python loop builds:
 *   - an SSE event whose description is cached (its id the one in effect, no retry, no bytes that
 *     are not UTF-8) and whose bytes are UTF-8;
 *   - an NDJSON or JSON-array value whose bytes are UTF-8;
 *   - an event-stream message with the header set of the message before it.
 * It stops at the first other event (a new header set or id, a malformed or cut event, bytes that
 * do not follow the recorded offset) and hands it back to the Python loop, which decides, writes
 * and raises as it always did. It checks nothing the Python code does not. A test compares the two
 * on generated events byte for byte; without a C compiler the writer runs its Python loop alone.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <openssl/evp.h>

typedef struct {
    PyObject *sse_type, *message_type, *value_type;  /* SSEEvent, EventStreamMessage, JSONValue */
    EVP_MD *sha256;        /* fetched once: OpenSSL 3 looks a digest up by name on every init otherwise */
    EVP_MD_CTX *hashing;   /* reused for every frame */
    PyObject *dumps;                                 /* orjson.dumps, for the arrival times */
    PyObject *plain_sse;                             /* writer._PLAIN_SSE: event type -> description */
} lines_state;

typedef struct {
    char *data;
    Py_ssize_t length, capacity;
} buffer;

/* The lines of one call: the writer joins the blocks of a batch once, as it joined its Python lines */
#define LINES_BLOCK (1 << 20)

static int
reserve(buffer *b, Py_ssize_t more)
{
    if (b->capacity - b->length >= more)
        return 0;
    Py_ssize_t wanted = b->capacity ? b->capacity : 4096;
    while (wanted - b->length < more) {
        if (wanted > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        wanted *= 2;
    }
    char *grown = PyMem_Realloc(b->data, (size_t)wanted);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = grown;
    b->capacity = wanted;
    return 0;
}

static int
put(buffer *b, const char *s, Py_ssize_t n)
{
    if (reserve(b, n) < 0)
        return -1;
    memcpy(b->data + b->length, s, (size_t)n);
    b->length += n;
    return 0;
}

#define PUT_LITERAL(b, s) put((b), (s), (Py_ssize_t)(sizeof(s) - 1))

static int
put_int(buffer *b, long long value)
{
    char digits[24];
    char *end = digits + sizeof digits, *at = end;
    unsigned long long magnitude = value < 0 ? 0ULL - (unsigned long long)value : (unsigned long long)value;
    do {
        *--at = (char)('0' + magnitude % 10);
        magnitude /= 10;
    } while (magnitude);
    if (value < 0)
        *--at = '-';
    return put(b, at, end - at);
}

/* `s` as a JSON string, escaped as orjson escapes it: quote, backslash and the control
 * characters below 0x20 (the five with a short form in it), nothing else. `s` is valid UTF-8.
 * Runs that need no escape, nearly all of a frame, are copied whole. */
static int
put_json_string(buffer *b, const unsigned char *s, Py_ssize_t n)
{
    static const char hex[] = "0123456789abcdef";
    if (n > (PY_SSIZE_T_MAX - 2) / 6 || reserve(b, 6 * n + 2) < 0) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    char *out = b->data + b->length;
    *out++ = '"';
    Py_ssize_t i = 0;
    while (i < n) {
        Py_ssize_t run = i;
        while (run < n && s[run] >= 0x20 && s[run] != '"' && s[run] != '\\')
            run++;
        memcpy(out, s + i, (size_t)(run - i));
        out += run - i;
        if (run == n)
            break;
        unsigned char c = s[run];
        i = run + 1;
        *out++ = '\\';
        switch (c) {
        case '"': *out++ = '"'; break;
        case '\\': *out++ = '\\'; break;
        case '\b': *out++ = 'b'; break;
        case '\t': *out++ = 't'; break;
        case '\n': *out++ = 'n'; break;
        case '\f': *out++ = 'f'; break;
        case '\r': *out++ = 'r'; break;
        default:
            *out++ = 'u';
            *out++ = '0';
            *out++ = '0';
            *out++ = hex[c >> 4];
            *out++ = hex[c & 15];
        }
    }
    *out++ = '"';
    b->length = out - b->data;
    return 0;
}

/* `s` in standard base64 with padding, no line end (binascii.b2a_base64(s, newline=False)). */
static int
put_base64(buffer *b, const unsigned char *s, Py_ssize_t n)
{
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    if (n > PY_SSIZE_T_MAX / 2 || reserve(b, (n + 2) / 3 * 4) < 0) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    char *out = b->data + b->length;
    Py_ssize_t i = 0;
    for (; i + 3 <= n; i += 3) {
        unsigned long v = ((unsigned long)s[i] << 16) | ((unsigned long)s[i + 1] << 8) | s[i + 2];
        *out++ = alphabet[(v >> 18) & 63];
        *out++ = alphabet[(v >> 12) & 63];
        *out++ = alphabet[(v >> 6) & 63];
        *out++ = alphabet[v & 63];
    }
    if (n - i == 1) {
        unsigned long v = (unsigned long)s[i] << 16;
        *out++ = alphabet[(v >> 18) & 63];
        *out++ = alphabet[(v >> 12) & 63];
        *out++ = '=';
        *out++ = '=';
    } else if (n - i == 2) {
        unsigned long v = ((unsigned long)s[i] << 16) | ((unsigned long)s[i + 1] << 8);
        *out++ = alphabet[(v >> 18) & 63];
        *out++ = alphabet[(v >> 12) & 63];
        *out++ = alphabet[(v >> 6) & 63];
        *out++ = '=';
    }
    b->length = out - b->data;
    return 0;
}

/* 1 where `s` decodes as strict UTF-8 (bytes.decode("utf-8") takes it), else 0: the well-formed
 * sequences of RFC 3629, table 3-7 of the Unicode standard (no overlong forms, no surrogates,
 * nothing past U+10FFFF), which is what CPython's decoder accepts. A test holds the two to the
 * same answer on every sequence of up to four bytes' leading pairs and on random bytes. */
static int
is_utf8(const char *text, Py_ssize_t n)
{
    const unsigned char *s = (const unsigned char *)text;
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        Py_ssize_t more;
        unsigned char low = 0x80, high = 0xBF;  /* the second byte's range */
        if (c >= 0xC2 && c <= 0xDF)
            more = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            more = 2;
            if (c == 0xE0)
                low = 0xA0;
            else if (c == 0xED)
                high = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            more = 3;
            if (c == 0xF0)
                low = 0x90;
            else if (c == 0xF4)
                high = 0x8F;
        } else
            return 0;
        if (n - i <= more || s[i + 1] < low || s[i + 1] > high)
            return 0;
        for (Py_ssize_t k = 2; k <= more; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
        i += more + 1;
    }
    return 1;
}

/* An int that fits a long long, into *out: 1; anything else 0, no exception set. */
static int
as_long_long(PyObject *value, long long *out)
{
    if (!PyLong_CheckExact(value))
        return 0;
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || (*out == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* The first 16 hex digits of sha256(raw), into hex16: what hashlib gives (it runs the same
 * OpenSSL), without making a Python hash object per frame, which cost more than the hashing. */
static int
sum_of(lines_state *state, PyObject *raw, char *hex16)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int digest_len = 0;
    if (!EVP_DigestInit_ex(state->hashing, state->sha256, NULL)
        || !EVP_DigestUpdate(state->hashing, PyBytes_AS_STRING(raw), (size_t)PyBytes_GET_SIZE(raw))
        || !EVP_DigestFinal_ex(state->hashing, digest, &digest_len) || digest_len < 8) {
        PyErr_SetString(PyExc_ValueError, "OpenSSL could not hash a frame");
        return -1;
    }
    for (int i = 0; i < 8; i++) {
        hex16[2 * i] = hex[digest[i] >> 4];
        hex16[2 * i + 1] = hex[digest[i] & 15];
    }
    return 0;
}

PyDoc_STRVAR(frame_lines_doc,
"frame_lines(events, t_ms, index, offset, sse_id, last_headers, last_types, headers_json, last_t, t_field)\n"
"--\n\n"
"The frame lines of events[index:] up to the first event the Python loop must take, with the\n"
"state that loop keeps: (index, offset, last_t, t_field, lines, raws), ``index`` the\n"
"first event not taken and ``raws`` the bytes of those taken, for the body hash. It stops once\n"
"LINES_BLOCK bytes of lines are made, so a large batch is not held twice over in one buffer.");

static PyObject *
frame_lines(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "frame_lines takes 10 arguments");
        return NULL;
    }
    lines_state *state = PyModule_GetState(module);
    if (state->sse_type == NULL || state->hashing == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "frame_lines called before setup");
        return NULL;
    }
    long long index, offset;
    if (!as_long_long(args[2], &index) || !as_long_long(args[3], &offset) || index < 0) {
        PyErr_SetString(PyExc_TypeError, "frame_lines: index and offset must be ints");
        return NULL;
    }
    PyObject *sse_id = args[4], *last_headers = args[5], *last_types = args[6], *headers_json = args[7];
    PyObject *last_t = args[8], *t_field = args[9];
    int headers_known = last_types == Py_None && PyDict_CheckExact(last_headers) && PyBytes_Check(headers_json);

    PyObject *events = PySequence_Fast(args[0], "frame_lines: events must be a sequence");
    if (events == NULL)
        return NULL;
    PyObject *times = PySequence_Fast(args[1], "frame_lines: t_ms must be a sequence");
    if (times == NULL) {
        Py_DECREF(events);
        return NULL;
    }
    Py_INCREF(last_t);
    Py_INCREF(t_field);
    buffer lines = {0};
    Py_ssize_t first = 0;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(events);
    if (PySequence_Fast_GET_SIZE(times) < count)
        count = PySequence_Fast_GET_SIZE(times);  /* zip() stops at the shorter */
    PyObject **event_items = PySequence_Fast_ITEMS(events), **time_items = PySequence_Fast_ITEMS(times);
    Py_ssize_t i = (Py_ssize_t)(index < count ? index : count);
    first = i;

    for (; i < count && lines.length < LINES_BLOCK; i++) {
        PyObject *event = event_items[i];
        PyObject *kind = (PyObject *)Py_TYPE(event);
        int is_sse = kind == state->sse_type, is_message = kind == state->message_type;
        if (!is_sse && !is_message && kind != state->value_type)
            break;
        if (PyTuple_GET_SIZE(event) < (is_sse ? 9 : is_message ? 6 : 5))
            break;
        long long seq, start;
        PyObject *raw = PyTuple_GET_ITEM(event, 3);
        if (!as_long_long(PyTuple_GET_ITEM(event, 0), &seq) || !as_long_long(PyTuple_GET_ITEM(event, 1), &start)
            || start != offset || !PyBytes_CheckExact(raw))
            break;
        const char *raw_bytes = PyBytes_AS_STRING(raw);
        Py_ssize_t raw_len = PyBytes_GET_SIZE(raw);
        int raw_is_text = is_utf8(raw_bytes, raw_len);
        PyObject *description = NULL, *payload = NULL;
        if (is_sse) {
            PyObject *invalid = PyTuple_GET_ITEM(event, 8);
            long long invalid_count;
            if (!raw_is_text || PyTuple_GET_ITEM(event, 7) != Py_None || !as_long_long(invalid, &invalid_count)
                || invalid_count != 0)
                break;
            int same_id = PyObject_RichCompareBool(PyTuple_GET_ITEM(event, 6), sse_id, Py_EQ);
            if (same_id < 0)
                goto error;
            if (!same_id)
                break;
            description = PyDict_GetItemWithError(state->plain_sse, PyTuple_GET_ITEM(event, 4));
            if (description == NULL && PyErr_Occurred())
                goto error;
            if (description == NULL || !PyBytes_Check(description))
                break;  /* borrowed: only orjson and hashlib run before it is copied, neither touches the cache */
        } else if (is_message) {
            PyObject *headers = PyTuple_GET_ITEM(event, 4);
            payload = PyTuple_GET_ITEM(event, 5);
            if (!headers_known || !PyDict_CheckExact(headers) || !PyBytes_CheckExact(payload))
                break;
            int same_headers = PyObject_RichCompareBool(headers, last_headers, Py_EQ);
            if (same_headers < 0)
                goto error;
            if (!same_headers)
                break;
        } else if (!raw_is_text) {
            break;
        }

        if (time_items[i] != last_t) {
            PyObject *encoded = PyObject_CallOneArg(state->dumps, time_items[i]);
            if (encoded == NULL || !PyBytes_Check(encoded)) {
                /* the Python loop meets the same value and raises as it always did */
                Py_XDECREF(encoded);
                PyErr_Clear();
                break;
            }
            Py_SETREF(t_field, encoded);
            Py_SETREF(last_t, Py_NewRef(time_items[i]));
        }
        char hex16[16];
        if (sum_of(state, raw, hex16) < 0)
            goto error;

        if (PUT_LITERAL(&lines, "{\"type\":\"frame\",\"seq\":") < 0 || put_int(&lines, seq) < 0
            || PUT_LITERAL(&lines, ",\"offset\":") < 0 || put_int(&lines, offset) < 0
            || PUT_LITERAL(&lines, ",\"len\":") < 0 || put_int(&lines, raw_len) < 0
            || PUT_LITERAL(&lines, ",\"sum\":\"") < 0 || put(&lines, hex16, 16) < 0
            || PUT_LITERAL(&lines, "\",\"t\":") < 0
            || put(&lines, PyBytes_AS_STRING(t_field), PyBytes_GET_SIZE(t_field)) < 0)
            goto error;
        if (raw_is_text) {
            if (PUT_LITERAL(&lines, ",\"raw\":") < 0
                || put_json_string(&lines, (const unsigned char *)raw_bytes, raw_len) < 0)
                goto error;
        } else if (PUT_LITERAL(&lines, ",\"raw_b64\":\"") < 0
                   || put_base64(&lines, (const unsigned char *)raw_bytes, raw_len) < 0 || PUT_LITERAL(&lines, "\"") < 0) {
            goto error;
        }
        if (is_message) {
            const char *payload_bytes = PyBytes_AS_STRING(payload);
            Py_ssize_t payload_len = PyBytes_GET_SIZE(payload);
            int payload_is_text = is_utf8(payload_bytes, payload_len);
            if (PUT_LITERAL(&lines, ",\"event\":{\"headers\":") < 0
                || put(&lines, PyBytes_AS_STRING(headers_json), PyBytes_GET_SIZE(headers_json)) < 0)
                goto error;
            if (payload_is_text) {
                if (PUT_LITERAL(&lines, ",\"payload\":") < 0
                    || put_json_string(&lines, (const unsigned char *)payload_bytes, payload_len) < 0)
                    goto error;
            } else if (PUT_LITERAL(&lines, ",\"payload_b64\":\"") < 0
                       || put_base64(&lines, (const unsigned char *)payload_bytes, payload_len) < 0
                       || PUT_LITERAL(&lines, "\"") < 0) {
                goto error;
            }
            if (PUT_LITERAL(&lines, "}}\n") < 0)
                goto error;
        } else if (description != NULL) {
            if (PUT_LITERAL(&lines, ",\"event\":") < 0
                || put(&lines, PyBytes_AS_STRING(description), PyBytes_GET_SIZE(description)) < 0
                || PUT_LITERAL(&lines, "}\n") < 0)
                goto error;
        } else if (PUT_LITERAL(&lines, ",\"event\":{\"json\":true}}\n") < 0) {
            goto error;
        }
        offset += raw_len;
    }

    PyObject *lines_out = PyBytes_FromStringAndSize(lines.data, lines.length);
    PyObject *raws_out = lines_out ? PyTuple_New(i - first) : NULL;
    for (Py_ssize_t k = first; raws_out != NULL && k < i; k++)
        PyTuple_SET_ITEM(raws_out, k - first, Py_NewRef(PyTuple_GET_ITEM(event_items[k], 3)));
    PyMem_Free(lines.data);
    Py_DECREF(events);
    Py_DECREF(times);
    if (raws_out == NULL) {
        Py_XDECREF(lines_out);
        Py_DECREF(last_t);
        Py_DECREF(t_field);
        return NULL;
    }
    /* N: the tuple takes the references held here */
    return Py_BuildValue("(nLNNNN)", i, offset, last_t, t_field, lines_out, raws_out);

error:
    PyMem_Free(lines.data);
    Py_DECREF(events);
    Py_DECREF(times);
    Py_DECREF(last_t);
    Py_DECREF(t_field);
    return NULL;
}

PyDoc_STRVAR(setup_doc,
"setup(sse_type, message_type, value_type, dumps, plain_sse)\n"
"--\n\n"
"The event types, the JSON writer and the cache of SSE descriptions frame_lines uses.");

static PyObject *
setup(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyType_Check(args[0]) || !PyType_Check(args[1]) || !PyType_Check(args[2])
        || !PyDict_CheckExact(args[4])) {
        PyErr_SetString(PyExc_TypeError, "setup(sse_type, message_type, value_type, dumps, plain_sse)");
        return NULL;
    }
    lines_state *state = PyModule_GetState(module);
    Py_XSETREF(state->sse_type, Py_NewRef(args[0]));
    Py_XSETREF(state->message_type, Py_NewRef(args[1]));
    Py_XSETREF(state->value_type, Py_NewRef(args[2]));
    Py_XSETREF(state->dumps, Py_NewRef(args[3]));
    Py_XSETREF(state->plain_sse, Py_NewRef(args[4]));
    Py_RETURN_NONE;
}

static int
lines_exec(PyObject *module)
{
    lines_state *state = PyModule_GetState(module);
    state->sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
    state->hashing = EVP_MD_CTX_new();
    if (state->sha256 == NULL || state->hashing == NULL) {
        PyErr_SetString(PyExc_ImportError, "OpenSSL has no SHA-256 here");
        return -1;
    }
    return 0;
}

/* the Python objects the module state holds, for the collector */
#define STATE_OBJECTS(EACH) EACH(sse_type) EACH(message_type) EACH(value_type) EACH(dumps) EACH(plain_sse)
#define VISIT_ONE(field) Py_VISIT(state->field);
#define CLEAR_ONE(field) Py_CLEAR(state->field);

static int
lines_traverse(PyObject *module, visitproc visit, void *arg)
{
    lines_state *state = PyModule_GetState(module);
    if (state != NULL) {
        STATE_OBJECTS(VISIT_ONE)
    }
    return 0;
}

static int
lines_clear(PyObject *module)
{
    lines_state *state = PyModule_GetState(module);
    if (state != NULL) {
        STATE_OBJECTS(CLEAR_ONE)
    }
    return 0;
}

static void
lines_free(void *module)
{
    lines_clear((PyObject *)module);
    lines_state *state = PyModule_GetState((PyObject *)module);
    if (state != NULL) {
        EVP_MD_CTX_free(state->hashing);
        EVP_MD_free(state->sha256);
        state->hashing = NULL;
        state->sha256 = NULL;
    }
}

static PyMethodDef lines_methods[] = {
    {"frame_lines", (PyCFunction)(void (*)(void))frame_lines, METH_FASTCALL, frame_lines_doc},
    {"setup", (PyCFunction)(void (*)(void))setup, METH_FASTCALL, setup_doc},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot lines_slots[] = {
    {Py_mod_exec, lines_exec},
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
#ifdef Py_mod_gil
    /* the loop reads the events and the cache through borrowed references: it relies on the GIL */
    {Py_mod_gil, Py_MOD_GIL_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef lines_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "streamtap.recording._lines",
    .m_doc = "The recording writer's common frame lines, in C.",
    .m_size = sizeof(lines_state),
    .m_methods = lines_methods,
    .m_slots = lines_slots,
    .m_traverse = lines_traverse,
    .m_clear = lines_clear,
    .m_free = lines_free,
};

PyMODINIT_FUNC
PyInit__lines(void)
{
    return PyModuleDef_Init(&lines_module);
}
