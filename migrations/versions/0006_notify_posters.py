"""webhooks when a run finishes (notifications and their attempts; a run's notify URL and round, a schedule's
notify), posters (a video's poster URI), and a run's encoder settings (codec, crf, preset)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""
import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        # Every run so far was encoded as H.264 at CRF 18 with x264's default preset.
        batch.add_column(sa.Column('codec', sa.String(length=16), nullable=False, server_default='h264'))
        batch.add_column(sa.Column('crf', sa.Integer(), nullable=False, server_default='18'))
        batch.add_column(sa.Column('preset', sa.String(length=16), nullable=False, server_default='medium'))
        batch.add_column(sa.Column('notify_url', sa.Text(), nullable=True))
        batch.add_column(sa.Column('round', sa.Integer(), nullable=False, server_default='0'))
    with op.batch_alter_table('videos') as batch:
        batch.add_column(sa.Column('poster_uri', sa.Text(), nullable=True))
    with op.batch_alter_table('schedules') as batch:
        batch.add_column(sa.Column('notify_url', sa.Text(), nullable=True))
    op.create_table(
        'notifications',
        sa.Column('run_id', sa.Integer(), nullable=False),
        sa.Column('round', sa.Integer(), nullable=False),
        sa.Column('key', sa.String(length=36), nullable=False),
        sa.Column('url', sa.Text(), nullable=False),
        sa.Column('body', sa.Text(), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('attempts', sa.Integer(), nullable=False),
        sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('give_up_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('delivered_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('lease_owner', sa.String(length=255), nullable=True),
        sa.Column('lease_token', sa.BigInteger(), nullable=False),
        sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_notifications_run_id_runs'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_notifications')),
        sa.UniqueConstraint('key', name=op.f('uq_notifications_key')),
        sa.UniqueConstraint('run_id', 'round', name=op.f('uq_notifications_run_id_round')),
    )
    op.create_index(op.f('ix_notifications_run_id'), 'notifications', ['run_id'], unique=False)
    op.create_index('ix_notifications_due', 'notifications', ['state', 'next_attempt_at'], unique=False)
    op.create_table(
        'notification_attempts',
        sa.Column('notification_id', sa.Integer(), nullable=False),
        sa.Column('number', sa.Integer(), nullable=False),
        sa.Column('sender', sa.String(length=255), nullable=False),
        sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('duration_s', sa.Float(), nullable=False),
        sa.Column('status_code', sa.Integer(), nullable=True),
        sa.Column('error', sa.Text(), nullable=True),
        sa.Column('accepted', sa.Boolean(), nullable=False),
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['notification_id'], ['notifications.id'],
                                name=op.f('fk_notification_attempts_notification_id_notifications'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_notification_attempts')),
        sa.UniqueConstraint('notification_id', 'number',
                            name=op.f('uq_notification_attempts_notification_id_number')),
    )
    op.create_index(op.f('ix_notification_attempts_notification_id'), 'notification_attempts', ['notification_id'],
                    unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_notification_attempts_notification_id'), table_name='notification_attempts')
    op.drop_table('notification_attempts')
    op.drop_index('ix_notifications_due', table_name='notifications')
    op.drop_index(op.f('ix_notifications_run_id'), table_name='notifications')
    op.drop_table('notifications')
    with op.batch_alter_table('schedules') as batch:
        batch.drop_column('notify_url')
    with op.batch_alter_table('videos') as batch:
        batch.drop_column('poster_uri')
    with op.batch_alter_table('runs') as batch:
        batch.drop_column('round')
        batch.drop_column('notify_url')
        batch.drop_column('preset')
        batch.drop_column('crf')
        batch.drop_column('codec')
