package server

import (
	"errors"
	"strconv"

	"github.com/limiterd/limiterd/api/v1alpha1"
)

// Batch limits.
const (
	// MaxBatchItems bounds the items of a batch.
	MaxBatchItems = v1alpha1.MaxBatchItems
	// MaxBatchBodyBytes bounds a batch's body: room for MaxBatchItems items that each name a
	// policy and a key of the longest lengths.
	MaxBatchBodyBytes = 2 << 20
	// maxBatchDepth bounds the nesting of a batch's JSON (values of unknown fields of an item
	// are read only to be skipped).
	maxBatchDepth = 32
)

// BatchItem is one item of a batch request: a decision request, or the error that keeps it
// from being one (Err, whose text can be shown to the client).
type BatchItem struct {
	AllowRequest
	Err error
}

// ErrTooManyItems is the error of a batch with more than MaxBatchItems items.
var ErrTooManyItems = errRequest("items holds more than " + strconv.Itoa(MaxBatchItems) + " items")

const (
	errItemsMissing  = errRequest("items is required")
	errItemsNotArray = errRequest("items must be an array")
	errItemNotObject = errRequest("item must be a JSON object")
	errItemDuplicate = errRequest("item names a field twice")
)

// DecodeBatchRequest decodes a batch of decision requests, {"items": [{...}, ...]}, appending
// its items to items. The body must be well-formed JSON and an object with the one field
// "items", an array of at most MaxBatchItems values; otherwise the whole batch is refused with
// an errRequest (ErrTooManyItems for too many items). Each value is decoded as the body of a
// single decision (DecodeAllowRequest): a value that is no valid request is an item with an
// error, and fails alone.
func DecodeBatchRequest(body []byte, items []BatchItem) ([]BatchItem, error) {
	d := jsonDecoder{data: body}
	haveItems := false
	err := d.object(&batchFields, func(int) error { // items, the one field
		haveItems = true
		var err error
		items, err = d.batchItems(items)
		return err
	})
	switch {
	case err != nil:
		return items, err
	case !haveItems:
		return items, errItemsMissing
	}
	return items, nil
}

// batchFields are the fields of a batch's JSON: items alone.
var batchFields = jsonFields{names: []string{"items"}, known: "items"}

// batchItems decodes the array of a batch's items.
func (d *jsonDecoder) batchItems(items []BatchItem) ([]BatchItem, error) {
	if !d.consume('[') {
		if err := d.skipValue(1); err != nil { // malformed JSON is told apart
			return items, err
		}
		return items, errItemsNotArray
	}
	d.skipSpace()
	if d.consume(']') {
		return items, nil
	}
	for n := 0; ; n++ {
		if n == MaxBatchItems {
			return items, ErrTooManyItems
		}
		d.skipSpace()
		start := d.pos
		if err := d.skipValue(1); err != nil {
			return items, err
		}
		items = append(items, decodeBatchItem(d.data[start:d.pos]))
		d.skipSpace()
		if d.consume(']') {
			return items, nil
		}
		if !d.consume(',') {
			return items, d.syntax("',' or ']' after an item")
		}
	}
}

// decodeBatchItem decodes one item, raw, a well-formed JSON value.
func decodeBatchItem(raw []byte) BatchItem {
	if raw[0] != '{' {
		return BatchItem{Err: errItemNotObject}
	}
	req, err := DecodeAllowRequest(raw)
	if errors.Is(err, errDuplicateField) {
		err = errItemDuplicate
	}
	return BatchItem{AllowRequest: req, Err: err}
}

// skipValue reads a well-formed JSON value of any type, nested at most maxBatchDepth deep in
// all, at depth.
func (d *jsonDecoder) skipValue(depth int) error {
	if depth > maxBatchDepth {
		return errRequest("JSON nested deeper than " + strconv.Itoa(maxBatchDepth) + " levels")
	}
	d.skipSpace()
	if d.pos >= len(d.data) {
		return d.syntax("a value")
	}
	switch c := d.data[d.pos]; {
	case c == '"':
		return d.skipString()
	case c == '{':
		d.pos++
		d.skipSpace()
		if d.consume('}') {
			return nil
		}
		for {
			d.skipSpace()
			if d.pos >= len(d.data) || d.data[d.pos] != '"' {
				return d.syntax("a field name")
			}
			if err := d.skipString(); err != nil {
				return err
			}
			d.skipSpace()
			if !d.consume(':') {
				return d.syntax("':' after a field name")
			}
			if err := d.skipValue(depth + 1); err != nil {
				return err
			}
			d.skipSpace()
			if d.consume('}') {
				return nil
			}
			if !d.consume(',') {
				return d.syntax("',' or '}' after a value")
			}
		}
	case c == '[':
		d.pos++
		d.skipSpace()
		if d.consume(']') {
			return nil
		}
		for {
			if err := d.skipValue(depth + 1); err != nil {
				return err
			}
			d.skipSpace()
			if d.consume(']') {
				return nil
			}
			if !d.consume(',') {
				return d.syntax("',' or ']' after a value")
			}
		}
	case c == 't':
		return d.literal("true")
	case c == 'f':
		return d.literal("false")
	case c == 'n':
		return d.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		return d.skipNumber()
	}
	return d.syntax("a value")
}

func (d *jsonDecoder) literal(lit string) error {
	if len(d.data)-d.pos >= len(lit) && string(d.data[d.pos:d.pos+len(lit)]) == lit {
		d.pos += len(lit)
		return nil
	}
	return d.syntax(lit)
}

// skipString reads a well-formed JSON string: no control character, valid escapes. Its bytes
// need not be valid UTF-8 (the item decoder checks the strings it keeps).
func (d *jsonDecoder) skipString() error {
	d.pos++ // the opening quote
	for d.pos < len(d.data) {
		c := d.data[d.pos]
		switch {
		case c == '"':
			d.pos++
			return nil
		case c < 0x20:
			return d.syntax("no control character in a string")
		case c == '\\':
			d.pos++
			if d.pos >= len(d.data) {
				return d.syntax("an escape")
			}
			e := d.data[d.pos]
			d.pos++
			switch e {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if _, ok := d.hex4(); !ok {
					return d.syntax("4 hex digits after \\u")
				}
			default:
				return d.syntax("a valid escape")
			}
		default:
			d.pos++
		}
	}
	return d.syntax("the end of a string")
}

// skipNumber reads a JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (d *jsonDecoder) skipNumber() error {
	d.consume('-')
	switch {
	case d.consume('0'):
	case d.pos < len(d.data) && d.data[d.pos] >= '1' && d.data[d.pos] <= '9':
		d.digits()
	default:
		return d.syntax("a digit")
	}
	if d.consume('.') && !d.digits() {
		return d.syntax("a digit after '.'")
	}
	if d.consume('e') || d.consume('E') {
		if !d.consume('+') {
			d.consume('-')
		}
		if !d.digits() {
			return d.syntax("a digit in the exponent")
		}
	}
	return nil
}

// digits reads digits and reports whether there was one.
func (d *jsonDecoder) digits() bool {
	start := d.pos
	for d.pos < len(d.data) && d.data[d.pos] >= '0' && d.data[d.pos] <= '9' {
		d.pos++
	}
	return d.pos > start
}
