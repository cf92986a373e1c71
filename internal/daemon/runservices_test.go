package daemon

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"
)

// orderService records its Start and Stop in a shared log.
type orderService struct {
	name     string
	log      *[]string
	startErr error
}

func (s *orderService) Start(context.Context) error {
	*s.log = append(*s.log, "start "+s.name)
	return s.startErr
}

func (s *orderService) Stop(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		*s.log = append(*s.log, "stop "+s.name+" without a deadline")
		return nil
	}
	*s.log = append(*s.log, "stop "+s.name)
	return nil
}

func TestRunServicesStopsInReverseOrder(t *testing.T) {
	var log []string
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // SIGTERM already arrived: start, then stop at once
	err := RunServices(ctx, time.Minute, &orderService{name: "stats", log: &log}, &orderService{name: "svc", log: &log})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"start stats", "start svc", "stop svc", "stop stats"}; !reflect.DeepEqual(log, want) {
		t.Fatalf("got %q, want %q", log, want)
	}
}

func TestRunServicesStopsWhatStartedWhenAStartFails(t *testing.T) {
	var log []string
	boom := errors.New("boom")
	err := RunServices(context.Background(), time.Minute,
		&orderService{name: "stats", log: &log},
		&orderService{name: "svc", log: &log, startErr: boom},
		&orderService{name: "never", log: &log})
	if !errors.Is(err, boom) {
		t.Fatalf("err %v, want the failed Start's", err)
	}
	if want := []string{"start stats", "start svc", "stop stats"}; !reflect.DeepEqual(log, want) {
		t.Fatalf("got %q, want %q", log, want)
	}
}
