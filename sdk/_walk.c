/* The check of a record batch's records section, compiled: the same rules as the pure-Python
 * walker in sdk/_walking.py (which says what they are and why), applied to the section in
 * pieces as it inflates, one byte state machine that holds nothing of the records.
 *
 * Walker(count).feed(piece) -> None, or the message of what is wrong (and it stays wrong);
 * Walker.finish() -> (largest timestamp delta, whether any key is null), or the message.
 *
 * A record: length (varint), attributes (one byte), timestamp delta (varlong), offset delta
 * (varint), key length and key, value length and value, header count, and each header's name
 * length, name (UTF-8), value length and value. Varints are zigzag, at most 10 bytes. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

enum {
    S_LENGTH, S_ATTRIBUTES, S_TIMESTAMP, S_OFFSET, S_KEY_LENGTH, S_KEY, S_VALUE_LENGTH, S_VALUE,
    S_HEADER_COUNT, S_NAME_LENGTH, S_NAME, S_HEADER_VALUE_LENGTH, S_HEADER_VALUE
};

typedef struct {
    PyObject_HEAD
    int64_t count;          /* records the batch header counts */
    int64_t index;          /* the record under way */
    int state;
    uint64_t raw;           /* a varint under way: its bits so far, and the next shift */
    int shift;
    int64_t length;         /* the record's length, and how much of it its fields took */
    int64_t used;
    int64_t skip;           /* bytes of a key, value, name or header value still to pass */
    int64_t headers;        /* headers of the record still to read */
    int64_t max_delta;
    int has_null_key;
    int utf8_need;          /* a name's UTF-8 sequence under way: bytes still due, their range */
    unsigned char utf8_lo, utf8_hi;
    int64_t trailing;       /* bytes after the last record */
    /* The first thing found wrong: a format and its numbers, set while the walk runs without
     * the GIL, made the message (`error`) once it is held again. */
    const char *wrong;
    long long wrong_args[3];
    PyObject *error;
} Walker;

static int
fail(Walker *w, const char *format, long long a, long long b, long long c)
{
    if (w->wrong == NULL) {
        w->wrong = format;
        w->wrong_args[0] = a;
        w->wrong_args[1] = b;
        w->wrong_args[2] = c;
    }
    return -1;
}

/* The message of what is wrong, made with the GIL held: NULL (and an exception) if it cannot. */
static PyObject *
error_of(Walker *w)
{
    if (w->error == NULL && w->wrong != NULL) {
        /* Formats take up to three numbers; those they do not name are ignored (C11 7.16.1). */
        w->error = PyUnicode_FromFormat(w->wrong, w->wrong_args[0], w->wrong_args[1],
                                        w->wrong_args[2]);
    }
    return w->error;
}

static int
overrun(Walker *w, int64_t used)
{
    return fail(w, "record %lld: its fields take %lld bytes, its length says %lld", w->index,
                used, w->length);
}

/* Taken `n` bytes of the record under way: within its length? */
static int
took(Walker *w, int64_t n)
{
    w->used += n;
    if (w->used > w->length) {
        return overrun(w, w->used);
    }
    return 0;
}

/* A key, value, name or header value of `size` bytes is next: does it fit the record? */
static int
will_skip(Walker *w, int64_t size, int state)
{
    if (size > w->length - w->used) {
        return overrun(w, w->used + size);
    }
    w->skip = size;
    w->state = state;
    return 0;
}

static int
record_ends(Walker *w)
{
    if (w->used != w->length) {
        return overrun(w, w->used);
    }
    w->index += 1;
    w->state = S_LENGTH;
    return 0;
}

static int
header_ends(Walker *w)
{
    w->headers -= 1;
    if (w->headers == 0) {
        return record_ends(w);
    }
    w->state = S_NAME_LENGTH;
    return 0;
}

static int
name_ends(Walker *w)
{
    if (w->utf8_need) {
        return fail(w, "record %lld: a header name is not UTF-8", w->index, 0, 0);
    }
    w->state = S_HEADER_VALUE_LENGTH;
    return 0;
}

/* One varint field read whole: its value, in the state that wanted it. */
static int
field(Walker *w, int64_t value)
{
    switch (w->state) {
    case S_LENGTH:
        if (value < 6) { /* at least attributes and five one-byte varints */
            return fail(w, "record %lld: length %lld does not fit the batch", w->index, value, 0);
        }
        w->length = value;
        w->used = 0;
        w->state = S_ATTRIBUTES;
        return 0;
    case S_TIMESTAMP:
        if (w->index == 0 || value > w->max_delta) {
            w->max_delta = value;
        }
        w->state = S_OFFSET;
        return 0;
    case S_OFFSET:
        if (value != w->index) {
            return fail(w, "record %lld has offset delta %lld", w->index, value, 0);
        }
        w->state = S_KEY_LENGTH;
        return 0;
    case S_KEY_LENGTH:
        if (value == -1) {
            w->has_null_key = 1;
            w->state = S_VALUE_LENGTH;
            return 0;
        }
        if (value < 0) {
            return fail(w, "record %lld: key length %lld", w->index, value, 0);
        }
        return will_skip(w, value, value ? S_KEY : S_VALUE_LENGTH);
    case S_VALUE_LENGTH:
        if (value == -1) {
            w->state = S_HEADER_COUNT;
            return 0;
        }
        if (value < 0) {
            return fail(w, "record %lld: value length %lld", w->index, value, 0);
        }
        return will_skip(w, value, value ? S_VALUE : S_HEADER_COUNT);
    case S_HEADER_COUNT:
        if (value < 0) {
            return fail(w, "record %lld: header count %lld", w->index, value, 0);
        }
        if (value == 0) {
            return record_ends(w);
        }
        w->headers = value;
        w->state = S_NAME_LENGTH;
        return 0;
    case S_NAME_LENGTH:
        if (value < 0) {
            return fail(w, "record %lld: header name length %lld", w->index, value, 0);
        }
        w->utf8_need = 0;
        if (value == 0) {
            return name_ends(w);
        }
        return will_skip(w, value, S_NAME);
    case S_HEADER_VALUE_LENGTH:
        if (value == -1) {
            return header_ends(w);
        }
        if (value < 0) {
            return fail(w, "record %lld: header value length %lld", w->index, value, 0);
        }
        if (value == 0) {
            return header_ends(w);
        }
        return will_skip(w, value, S_HEADER_VALUE);
    }
    return fail(w, "the walker lost its place (state %lld)", w->state, 0, 0);
}

/* One byte of a header name: UTF-8 as Python's strict decoder takes it (no overlong forms, no
 * surrogates, nothing past U+10FFFF; Unicode's table 3-7). */
static int
utf8_byte(Walker *w, unsigned char b)
{
    if (w->utf8_need) {
        if (b < w->utf8_lo || b > w->utf8_hi) {
            return -1;
        }
        w->utf8_need -= 1;
        w->utf8_lo = 0x80;
        w->utf8_hi = 0xBF;
        return 0;
    }
    if (b < 0x80) {
        return 0;
    }
    w->utf8_lo = 0x80;
    w->utf8_hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
        w->utf8_need = 1;
    } else if (b == 0xE0) {
        w->utf8_need = 2;
        w->utf8_lo = 0xA0;
    } else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) {
        w->utf8_need = 2;
    } else if (b == 0xED) {
        w->utf8_need = 2;
        w->utf8_hi = 0x9F;
    } else if (b == 0xF0) {
        w->utf8_need = 3;
        w->utf8_lo = 0x90;
    } else if (b >= 0xF1 && b <= 0xF3) {
        w->utf8_need = 3;
    } else if (b == 0xF4) {
        w->utf8_need = 3;
        w->utf8_hi = 0x8F;
    } else {
        return -1;
    }
    return 0;
}

static int
walk(Walker *w, const unsigned char *p, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n) {
        if (w->index >= w->count) {
            w->trailing += n - i;
            return 0;
        }
        int state = w->state;
        if (state == S_KEY || state == S_VALUE || state == S_HEADER_VALUE || state == S_NAME) {
            int64_t take = n - i < w->skip ? n - i : w->skip;
            if (state == S_NAME) {
                for (int64_t k = 0; k < take; k++) {
                    if (utf8_byte(w, p[i + k]) < 0) {
                        return fail(w, "record %lld: a header name is not UTF-8", w->index, 0, 0);
                    }
                }
            }
            i += take;
            w->skip -= take;
            if (took(w, take) < 0) {
                return -1;
            }
            if (w->skip == 0) {
                int ended = 0;
                if (state == S_KEY) {
                    w->state = S_VALUE_LENGTH;
                } else if (state == S_VALUE) {
                    w->state = S_HEADER_COUNT;
                } else if (state == S_NAME) {
                    ended = name_ends(w);
                } else {
                    ended = header_ends(w);
                }
                if (ended < 0) {
                    return -1;
                }
            }
            continue;
        }
        unsigned char b = p[i++];
        if (state != S_LENGTH && took(w, 1) < 0) {
            return -1;
        }
        if (state == S_ATTRIBUTES) {
            w->state = S_TIMESTAMP;
            continue;
        }
        if (w->shift < 64) {
            w->raw |= (uint64_t)(b & 0x7F) << w->shift;
        }
        if (b & 0x80) {
            w->shift += 7;
            if (w->shift > 63) {
                return fail(w, "a varint is longer than 10 bytes", 0, 0, 0);
            }
            continue;
        }
        int64_t value = (int64_t)(w->raw >> 1) ^ -(int64_t)(w->raw & 1);
        w->raw = 0;
        w->shift = 0;
        if (field(w, value) < 0) {
            return -1;
        }
    }
    return 0;
}

static int
Walker_init(Walker *w, PyObject *args, PyObject *kwargs)
{
    long long count;
    static char *names[] = {"count", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "L", names, &count)) {
        return -1;
    }
    w->count = count;
    w->index = 0;
    w->state = S_LENGTH;
    w->raw = 0;
    w->shift = 0;
    w->length = w->used = w->skip = w->headers = 0;
    w->max_delta = 0;
    w->has_null_key = 0;
    w->utf8_need = 0;
    w->trailing = 0;
    w->wrong = NULL;
    Py_CLEAR(w->error);
    return 0;
}

static void
Walker_dealloc(Walker *w)
{
    Py_CLEAR(w->error);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static PyObject *
Walker_feed(Walker *w, PyObject *piece)
{
    if (w->wrong == NULL) {
        Py_buffer view;
        if (PyObject_GetBuffer(piece, &view, PyBUF_SIMPLE) < 0) {
            return NULL;
        }
        /* The walk touches no Python object: other threads (the event loop) run meanwhile. */
        Py_BEGIN_ALLOW_THREADS
        walk(w, (const unsigned char *)view.buf, view.len);
        Py_END_ALLOW_THREADS
        PyBuffer_Release(&view);
    }
    if (w->wrong != NULL) {
        return Py_XNewRef(error_of(w));
    }
    Py_RETURN_NONE;
}

static PyObject *
Walker_finish(Walker *w, PyObject *Py_UNUSED(ignored))
{
    if (w->wrong == NULL) {
        if (w->index < w->count) {
            if (w->state == S_LENGTH) {
                fail(w, "the records section ends inside a record", 0, 0, 0);
            } else {
                fail(w, "record %lld: length %lld does not fit the batch", w->index, w->length, 0);
            }
        } else if (w->trailing) {
            fail(w, "the records section holds %lld bytes after the %lld records it counts",
                 w->trailing, w->count, 0);
        }
    }
    if (w->wrong != NULL) {
        return Py_XNewRef(error_of(w));
    }
    return Py_BuildValue("(LO)", (long long)w->max_delta, w->has_null_key ? Py_True : Py_False);
}

static PyMethodDef Walker_methods[] = {
    {"feed", (PyCFunction)Walker_feed, METH_O,
     "Walk the next piece of the records section: None, or what is wrong."},
    {"finish", (PyCFunction)Walker_finish, METH_NOARGS,
     "(largest timestamp delta, any null key), or what is wrong."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WalkerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sdk._walk.Walker",
    .tp_basicsize = sizeof(Walker),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The compiled walk of a records section, fed in pieces.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Walker_init,
    .tp_dealloc = (destructor)Walker_dealloc,
    .tp_methods = Walker_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "sdk._walk",
    .m_doc = "A record batch's records section, walked in C.",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__walk(void)
{
    if (PyType_Ready(&WalkerType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "Walker", (PyObject *)&WalkerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
