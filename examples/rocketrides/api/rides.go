package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stripe/stripe-go/v82"
	"go.uber.org/zap"

	"github.com/idemd/idemd/examples/rocketrides/receipts"
	"github.com/idemd/idemd/idem"
)

// Recovery points of POST /rides, in order.
const (
	RecoveryPointStarted       = idem.RecoveryPointStarted
	RecoveryPointRideCreated   = "ride_created"
	RecoveryPointChargeCreated = "charge_created"
	RecoveryPointFinished      = idem.RecoveryPointFinished
)

// The article's fixed price: $20 a ride.
const (
	RideAmount   = 20_00
	RideCurrency = "usd"
)

// Response messages.
const (
	MsgOK                  = "Payment accepted. Your pilot is on their way!"
	msgPaymentDeclinedFmt  = "Error from payment processor: %s"
	msgPaymentUnavailable  = "Error from payment processor. Please retry the request with the same Idempotency-Key."
	auditActionRideCreated = "ride.created"
	maxRideBody            = 64 << 10
)

// RideCreated is the body of a successful POST /rides.
type RideCreated struct {
	Message string `json:"message"`
	RideID  int64  `json:"ride_id"`
}

func (s *server) createRide(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	user := userFrom(ctx)
	keyVal := r.Header.Get("Idempotency-Key")
	if err := idem.ValidateKey(keyVal); err != nil {
		s.store.WriteError(w, err)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRideBody))
	if err != nil {
		idem.WriteJSONError(w, http.StatusRequestEntityTooLarge, "Request body too large.")
		return
	}
	params, err := ParseRideParams(r.Header.Get("Content-Type"), body)
	if err != nil {
		var pe *ParamError
		errors.As(err, &pe)
		idem.WriteJSONError(w, pe.Status, pe.Msg)
		return
	}
	if err := s.faults.check(AtBefore); err != nil {
		s.log.Info("injected fault before any work", zap.Error(err))
		idem.WriteJSONError(w, http.StatusInternalServerError, idem.MsgInternal)
		return
	}

	ride := &rideFlow{s: s, user: user, params: params, originIP: originIP(r)}
	out, err := s.store.Execute(ctx, idem.Request{
		UserID: user.ID, Key: keyVal, Method: r.Method, Path: r.URL.Path, Params: params,
	}, ride.phases())
	if err != nil {
		s.logOutcome(user, keyVal, idem.StatusOf(err), err)
		s.store.WriteError(w, err)
		return
	}
	if !out.Replayed {
		s.logOutcome(user, keyVal, out.Status, nil)
	}
	idem.WriteOutcome(w, out)
}

func (s *server) logOutcome(u *User, key string, status int, err error) {
	fields := []zap.Field{zap.Int64("user_id", u.ID), zap.String("idempotency_key", key), zap.Int("status", status)}
	switch {
	case err == nil:
		s.log.Debug("ride request finished", fields...)
	case status >= 500:
		s.log.Warn("ride request failed", append(fields, zap.Error(err))...)
	default:
		s.log.Info("ride request refused", append(fields, zap.Error(err))...)
	}
}

// rideFlow holds what the phases of one request share. The ride is looked
// up again when a request resumes from a later recovery point.
type rideFlow struct {
	s        *server
	user     *User
	params   RideParams
	originIP string
	// charge is the charge a previous attempt of the charge phase got from
	// Stripe, kept across retries of that phase (serialization failures,
	// deadlocks): asking again would return the same charge (same upstream
	// key), only later, and a Stripe round trip inside the transaction is
	// what makes a SERIALIZABLE phase conflict in the first place.
	charge       *stripe.Charge
	chargeRideID int64
}

func (f *rideFlow) phases() idem.Phases {
	return idem.Phases{
		RecoveryPointStarted:       f.createRide,
		RecoveryPointRideCreated:   f.createCharge,
		RecoveryPointChargeCreated: f.sendReceipt,
	}
}

func (f *rideFlow) createRide(ctx context.Context, tx pgx.Tx, k *idem.Key) (idem.Result, error) {
	if err := f.s.faults.check(RecoveryPointStarted); err != nil {
		return nil, err
	}
	p := f.params
	var rideID int64
	err := tx.QueryRow(ctx, `INSERT INTO rides (idempotency_key_id, origin_lat, origin_lon, target_lat, target_lon, user_id)
		VALUES ($1, $2, $3, $4, $5, $6) RETURNING id`,
		k.ID, p.OriginLat, p.OriginLon, p.TargetLat, p.TargetLon, f.user.ID).Scan(&rideID)
	if err != nil {
		return nil, fmt.Errorf("create ride: %w", err)
	}
	data, _ := json.Marshal(p)
	if _, err := tx.Exec(ctx, `INSERT INTO audit_records (action, data, origin_ip, resource_id, resource_type, user_id)
		VALUES ($1, $2, $3, $4, 'ride', $5)`,
		auditActionRideCreated, string(data), f.originIP, rideID, f.user.ID); err != nil {
		return nil, fmt.Errorf("create ride: audit record: %w", err)
	}
	return idem.RecoveryPoint(RecoveryPointRideCreated), nil
}

func (f *rideFlow) createCharge(ctx context.Context, tx pgx.Tx, k *idem.Key) (idem.Result, error) {
	if err := f.s.faults.check(RecoveryPointRideCreated); err != nil {
		return nil, err
	}
	rideID, err := rideForKey(ctx, tx, k)
	if err != nil {
		return nil, err
	}
	if k.UpstreamIdempotencyKey == uuid.Nil {
		return nil, errors.New("create charge: key has no upstream idempotency key")
	}
	cp := &stripe.ChargeCreateParams{
		Amount:      stripe.Int64(RideAmount),
		Currency:    stripe.String(RideCurrency),
		Customer:    stripe.String(f.user.StripeCustomerID),
		Description: stripe.String(fmt.Sprintf("Charge for ride %d", rideID)),
	}
	// The same upstream key on every retry of this key: Stripe returns the
	// charge it already made instead of charging twice.
	cp.SetIdempotencyKey(k.UpstreamIdempotencyKey.String())
	charge, err := f.charge, error(nil)
	if charge == nil || f.chargeRideID != rideID {
		charge, err = f.s.stripe.V1Charges.Create(ctx, cp)
	}
	if err != nil {
		var se *stripe.Error
		if errors.As(err, &se) && se.Type == stripe.ErrorTypeCard {
			// Final: the decline is stored and replayed like a success.
			body, _ := json.Marshal(map[string]string{"error": fmt.Sprintf(msgPaymentDeclinedFmt, se.Msg)})
			return idem.Response(http.StatusPaymentRequired, body), nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("create charge: %w", err)
		}
		// Not final: unlock and let the client or the completer retry.
		body, _ := json.Marshal(map[string]string{"error": msgPaymentUnavailable})
		return nil, &idem.ResponseError{Status: http.StatusServiceUnavailable, Body: body, Err: fmt.Errorf("create charge: %w", err)}
	}
	f.charge, f.chargeRideID = charge, rideID
	if _, err := tx.Exec(ctx, `UPDATE rides SET stripe_charge_id = $2 WHERE id = $1`, rideID, charge.ID); err != nil {
		return nil, fmt.Errorf("create charge: record charge id: %w", err)
	}
	return idem.RecoveryPoint(RecoveryPointChargeCreated), nil
}

func (f *rideFlow) sendReceipt(ctx context.Context, tx pgx.Tx, k *idem.Key) (idem.Result, error) {
	if err := f.s.faults.check(RecoveryPointChargeCreated); err != nil {
		return nil, err
	}
	rideID, err := rideForKey(ctx, tx, k)
	if err != nil {
		return nil, err
	}
	// Created in this phase's transaction: the receipt job exists exactly
	// when the ride is finished.
	args := receipts.Args{Amount: RideAmount, Currency: RideCurrency, UserID: f.user.ID, RideID: rideID}
	switch f.s.receiptJobs {
	case ReceiptJobsStaged:
		if _, err := idem.StageJob(ctx, tx, receipts.Kind, args, nil); err != nil {
			return nil, err
		}
	case ReceiptJobsRiver:
		if _, err := f.s.river.InsertTx(ctx, tx, args, nil); err != nil {
			return nil, fmt.Errorf("send receipt: river insert: %w", err)
		}
	}
	body, _ := json.Marshal(RideCreated{Message: MsgOK, RideID: rideID})
	return idem.Response(http.StatusCreated, body), nil
}

func rideForKey(ctx context.Context, tx pgx.Tx, k *idem.Key) (int64, error) {
	var id int64
	err := tx.QueryRow(ctx, `SELECT id FROM rides WHERE idempotency_key_id = $1`, k.ID).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("bug: no ride for key %d at recovery point %s", k.ID, k.RecoveryPoint)
	}
	if err != nil {
		return 0, fmt.Errorf("look up ride for key %d: %w", k.ID, err)
	}
	return id, nil
}

// originIP is the client address for the audit record. The API is meant to
// run behind a trusted proxy in production; X-Forwarded-For handling is left
// to that deployment and not trusted here.
func originIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil || net.ParseIP(host) == nil {
		return "0.0.0.0"
	}
	return host
}
