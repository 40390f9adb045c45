package server

import (
	"errors"
	"strconv"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/internal/jsonscan"
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

var errTooDeep = errRequest("JSON nested deeper than " + strconv.Itoa(maxBatchDepth) + " levels")

// DecodeBatchRequest decodes a batch of decision requests, {"items": [{...}, ...]}, appending
// its items to items. The body must be well-formed JSON and an object with the one field
// "items", an array of at most MaxBatchItems values; otherwise the whole batch is refused with
// an errRequest (ErrTooManyItems for too many items). Each value is decoded as the body of a
// single decision (DecodeAllowRequest): a value that is no valid request is an item with an
// error, and fails alone.
func DecodeBatchRequest(body []byte, items []BatchItem) ([]BatchItem, error) {
	d := jsonDecoder{Scanner: jsonscan.Scanner{Data: body}}
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
	if !d.Consume('[') {
		if f := d.Skip(maxBatchDepth); f.Failed() { // malformed JSON is told apart
			return items, d.fault(f)
		}
		return items, errItemsNotArray
	}
	d.SkipSpace()
	if d.Consume(']') {
		return items, nil
	}
	for n := 0; ; n++ {
		if n == MaxBatchItems {
			return items, ErrTooManyItems
		}
		d.SkipSpace()
		start := d.Pos
		if f := d.Skip(maxBatchDepth); f.Failed() {
			return items, d.fault(f)
		}
		items = append(items, decodeBatchItem(d.Data[start:d.Pos]))
		if more, f := d.Next(']'); !more {
			if f.Failed() {
				return items, d.syntax("',' or ']' after an item")
			}
			return items, nil
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
